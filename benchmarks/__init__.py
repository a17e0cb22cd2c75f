"""Benchmarks, runnable as ``python -m benchmarks.<name>`` with ``PYTHONPATH=services``."""
