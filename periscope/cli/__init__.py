"""The `periscope` command line."""
