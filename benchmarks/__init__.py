"""Benchmarks for retrieval-stage: run ``python -m benchmarks`` (see benchmarks/README.md)."""
