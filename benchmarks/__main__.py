"""``python -m benchmarks [name ...] [-- options]``: run benchmarks by name (default: all)."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "attribution": "benchmarks.attribution",
    "performance": "benchmarks.performance",
}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    names = [a for a in args if a in BENCHMARKS] or list(BENCHMARKS)
    rest = [a for a in args if a not in BENCHMARKS]
    code = 0
    for name in names:
        print(f"== benchmark: {name} ==", flush=True)
        code |= importlib.import_module(BENCHMARKS[name]).main(rest)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
