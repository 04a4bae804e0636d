"""Benchmarks: ``python -m mta.bench <name>`` (see README)."""
