"""`python -m services.joiner [flags]`: the same as `periscope join [flags]`."""

from __future__ import annotations

import sys

from periscope.cli.main import main

if __name__ == "__main__":
    main(["join", *sys.argv[1:]])
