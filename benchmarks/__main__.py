"""``python -m benchmarks [name ...] [-- options]``: run benchmarks by name (default: all)."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "attribution": "benchmarks.attribution",
    "performance": "benchmarks.performance",
}
#: run only when named (an hour-long study, or a variant of one)
ON_REQUEST = {
    "paper_scale": "benchmarks.paper_scale",
    "cheaper_variants": "benchmarks.cheaper_variants",
    "training_options": "benchmarks.training_options",
    "crowd_reader": "benchmarks.crowd_reader",
    # issue #44: the GPU check (benchmarks/gpu_check.sh on a lent GPU; --dry-run on a CPU)
    "gpu": "benchmarks.gpu",
    "gpu_pack": "benchmarks.gpu_pack",
    # issue #51: a prompted LLM's shared prefix cached vs recomputed (8-shot prompt)
    "prefix_cache": "benchmarks.prefix_cache",
    # issue #46: saleval's ERASER convention against ERASER's scorer (--scorer <checkout>)
    "eraser_agreement": "benchmarks.eraser_agreement",
    # issue #54: the default run with the last block at the first token only vs whole
    "cls_only": "benchmarks.cls_only",
}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    known = {**BENCHMARKS, **ON_REQUEST}
    names = [a for a in args if a in known] or list(BENCHMARKS)
    rest = [a for a in args if a not in known]
    code = 0
    for name in names:
        print(f"== benchmark: {name} ==", flush=True)
        code |= importlib.import_module(known[name]).main(rest)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
