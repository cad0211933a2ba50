"""Benchmarks: ``python -m benchmarks <name> [options]`` (``make bench``).

Each benchmark module has ``main(argv) -> int`` and prints a table. They run on
the embedded model and real shared data, so numbers are comparable across changes.
"""
