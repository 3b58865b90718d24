"""Benchmarks: `python -m bench.<name>` (`--quick` for a small size). Each prints a table
and writes bench/results/<name>.json with the figures its issue names. Targets are
ratios against a baseline measured in the same run, since machines are noisy."""
