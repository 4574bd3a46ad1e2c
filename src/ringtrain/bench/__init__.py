"""Benchmark harness pieces: the models and data the examples and benchmarks share."""
