"""Batch-size policies, benchmarking through a Backend, the benchmark cache, WR and WD."""
