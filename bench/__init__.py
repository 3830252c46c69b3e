"""Benchmarks of the Periscope pipeline: `make bench`, `bench/run.py --quick`."""
