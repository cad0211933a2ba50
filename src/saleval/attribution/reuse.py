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
import logging
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from saleval.vocab import Target

log = logging.getLogger(__name__)
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
    with the parents' fingerprints by :func:`saleval.pipeline.records.fingerprints.fingerprint`.

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


#: computes the given methods (key -> settings) on the run's samples: (attributions,
#: predictions), as :func:`saleval.attribution.explain_frame` returns them
Compute = Callable[[Mapping[str, Any]], tuple[pd.DataFrame, pd.DataFrame]]


@dataclass
class MethodReuse:
    """The bookkeeping of per-method reuse in one explain run: which methods are stored
    already (by :attr:`prints`, method key -> fingerprint), loading those, computing the
    rest, and storing what was computed. ``store`` None: reuse is off (nothing is found,
    nothing stored), so the stage runs the same code either way."""

    store: MethodStore | None = None
    prints: dict[str, str] = field(default_factory=dict)

    def available(self, methods: Mapping[str, Any]) -> dict[str, str]:
        """Method key -> fingerprint of the methods with a stored result."""
        if self.store is None:
            return {}
        root = self.store.root
        return {
            k: self.prints[k]
            for k in methods
            if k in self.prints and (root / self.prints[k]).is_dir()
        }

    def load(
        self, stored: Mapping[str, str], sample_ids: Sequence[str], targets: Sequence[int]
    ) -> dict[str, Stored]:
        """The stored results that cover exactly these samples and targets."""
        loaded = {}
        for key, fp in stored.items():
            got = None if self.store is None else self.store.load(fp, sample_ids, targets)
            if got is not None:
                loaded[key] = got
                log.info("explain: %s reused (fingerprint %s, run %s)", key, fp, got.run_id)
        return loaded

    def explain(
        self,
        methods: Mapping[str, Any],
        compute: Compute,
        target: Target,
        timings: dict[str, dict[str, float]],
        diag: dict[str, dict[str, list[float]]],
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Every method's attribution rows, in the methods' order, and the predictions: the
        stored methods loaded (their timings and diagnostics as their run recorded them,
        marked reused), the others computed by ``compute``, and a stored method whose
        result covers other samples or targets computed after all."""
        from saleval.attribution.base import method_name

        stored = self.available(methods)
        attributions, predictions = compute({k: m for k, m in methods.items() if k not in stored})
        if not stored:
            return attributions, predictions
        col = "label" if target is Target.gold else "pred"
        targets = predictions[col].astype(int).tolist()
        loaded = self.load(stored, predictions["sample_id"].tolist(), targets)
        missed = {k: methods[k] for k in stored if k not in loaded}
        if missed:
            attributions = pd.concat([attributions, compute(missed)[0]], ignore_index=True)
        for key, got in loaded.items():
            name = method_name(key, methods[key])
            attributions = pd.concat([attributions, got.rows], ignore_index=True)
            timings[name] = {"seconds": got.seconds,
                             "examples_per_s": len(predictions) / max(got.seconds, 1e-9)}  # fmt: skip
            if got.diagnostics:
                diag[name] = got.diagnostics
        order = [method_name(k, m) for k, m in methods.items()]
        attributions = attributions.sort_values(
            "method", key=lambda c: c.map(order.index), kind="stable"
        ).reset_index(drop=True)
        for key in loaded:
            timings[method_name(key, methods[key])]["reused"] = 1.0
        return attributions, predictions

    def save(
        self,
        methods: Mapping[str, Any],
        attributions: pd.DataFrame,
        timings: dict[str, dict[str, float]],
        diag: Mapping[str, dict[str, list[float]]],
        run_id: str | None,
    ) -> None:
        """Store every method this run computed; mark each method reused or not."""
        from saleval.attribution.base import method_name

        if self.store is None:
            return
        for key, m in methods.items():
            name = method_name(key, m)
            if timings.get(name, {}).get("reused"):
                continue
            timings.setdefault(name, {})["reused"] = 0.0
            rows = attributions[attributions["method"] == name].reset_index(drop=True)
            seconds = float(timings[name].get("seconds", 0.0))
            self.store.save(
                self.prints[key], Stored(rows, seconds, dict(diag.get(name, {})), run_id)
            )
