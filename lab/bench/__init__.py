"""Benchmarks: all-reduce bus bandwidth, strong/weak scaling (and, later, the data pipeline)."""
