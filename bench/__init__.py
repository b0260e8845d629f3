"""Benchmark programs: each prints its ratio against a baseline measured in the same run."""
