"""Exact reuse of one method's scores between explain runs (docs/methods.md#reuse).

A sweep over one method's settings (``+experiment=variants_ig``: 15 jobs) re-ran every
other method in every job, although their scores could not change. Each method's result
is therefore stored under a fingerprint of everything that determines it, and a later
explain run whose method has the same fingerprint loads the rows instead of computing
them. The fingerprint covers the model (its train run's fingerprint), the samples (the
dataset, ``data``, ``seed``, the target, ``max_length``), the method's own settings, the
device kind and whether it has native bf16 (``bf16: auto`` resolves by it), and a digest of
the code that computes scores — a changed method implementation never serves stale
numbers. Reused rows are checked against this run's samples and targets before use.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

#: the source files whose code decides a method's scores (relative to the package)
CODE = ("attribution", "words.py", "modeling/inference.py", "modeling/first_token.py", "vocab.py")
#: explain settings that change how the work is batched, shown or logged, not its scores
NOT_SCORES = ("method", "view", "batch_size", "progress", "run_dir", "paths", "tracking",
              "hydra", "inputs", "reuse_methods")  # fmt: skip


def code_digest() -> str:
    """Digest of the scoring code's source (:data:`CODE`)."""
    pkg = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for rel in CODE:
        path = pkg / rel
        files = sorted(path.glob("*.py")) if path.is_dir() else [path]
        for f in files:
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def method_identity(
    resolved: Mapping[str, Any],
    key: str,
    settings: Any,
    device: Mapping[str, Any],
    code: str,
) -> dict[str, Any]:
    """What one method's scores depend on besides its parents (module docstring): hashed
    with the parents' fingerprints by :func:`saleval.pipeline.stage.fingerprint`.

    ``resolved``: the explain config, resolved; ``settings``: the method's entry;
    ``device``: its kind and bf16 support; ``code``: :func:`code_digest`.

    >>> a = method_identity({"seed": 1, "view": {"k": 5}}, "lime", {"n": 1}, {}, "c")
    >>> a == method_identity({"seed": 1, "view": {"k": 9}}, "lime", {"n": 1}, {}, "c")
    True
    >>> a == method_identity({"seed": 2, "view": {"k": 5}}, "lime", {"n": 1}, {}, "c")
    False
    """
    shared = {k: v for k, v in resolved.items() if k not in NOT_SCORES}
    if isinstance(shared.get("dataset"), dict):  # where the files sit is not what they are
        shared["dataset"] = {k: v for k, v in shared["dataset"].items() if k != "data_root"}
    return {"what": "explain-method", "shared": shared, "method": {key: settings},
            "device": dict(device), "code": code}  # fmt: skip


@dataclass
class Stored:
    """One method's stored result: its attribution rows and what its run recorded."""

    rows: pd.DataFrame
    seconds: float
    diagnostics: dict[str, list[float]] = field(default_factory=dict)
    run_id: str | None = None


class MethodStore:
    """Method results by fingerprint under ``root`` (``<output_root>/cache/explain``).

    One directory per fingerprint, written to a temporary name and renamed, so parallel
    sweep jobs never read half a result.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def load(self, fp: str, sample_ids: Sequence[str], targets: Sequence[int]) -> Stored | None:
        """The stored result of ``fp`` if it covers exactly these samples with these targets."""
        where = self.root / fp
        try:
            meta = json.loads((where / "meta.json").read_text())
            rows = pd.read_parquet(where / "attributions.parquet")
        except (OSError, ValueError):
            return None
        first = rows.drop_duplicates("sample_id")
        if first["sample_id"].astype(str).tolist() != [str(s) for s in sample_ids]:
            return None
        if first["target"].astype(int).tolist() != [int(t) for t in targets]:
            return None
        return Stored(rows, float(meta["seconds"]), meta.get("diagnostics") or {},
                      meta.get("run_id"))  # fmt: skip

    def save(self, fp: str, stored: Stored) -> None:
        """Keep ``stored`` under ``fp`` (an existing entry of the same fingerprint stays)."""
        if (self.root / fp).is_dir():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{fp}-", dir=self.root))
        stored.rows.to_parquet(tmp / "attributions.parquet", index=False)
        meta = {"seconds": stored.seconds, "diagnostics": stored.diagnostics,
                "run_id": stored.run_id}  # fmt: skip
        (tmp / "meta.json").write_text(json.dumps(meta))
        try:
            os.rename(tmp, self.root / fp)
        except OSError:  # another job stored the same fingerprint first
            for f in tmp.iterdir():
                f.unlink()
            tmp.rmdir()
