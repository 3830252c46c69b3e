"""`python -m services.probe`: the same as `periscope probe`."""

from services.probe.cli import command

if __name__ == "__main__":
    command()
