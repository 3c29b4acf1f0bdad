"""Benchmarks: each module runs as ``python -m bench.<name>`` and writes ``docs/bench/<name>.md``."""
