"""What ``benchmarks/performance.py`` compares saleval's engine with: every metric as a
naive per-example loop (one padded forward per example of all its perturbed inputs, no
cross-example batching, no length sorting, no cache), and ferret (``ferret-xai`` in
``.venv-ferret``, run as a subprocess by :mod:`benchmarks.ferret_side`).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import Setup, Timing, timed
from benchmarks.naive import probs_padded
from saleval.metrics import faithfulness as F
from saleval.metrics.config import MetricsConfig, n_words_for_fraction

ROOT = Path(__file__).resolve().parents[1]
FERRET_PYTHON = ROOT / ".venv-ferret" / "bin" / "python"


def naive_metrics(
    s: Setup, items: list[F.Explanation], config: MetricsConfig
) -> tuple[dict[str, Timing], dict[tuple[str, str, str, str], float]]:
    """Every metric family per explanation, one padded forward per explanation and family
    (the switching point: per chunk of deletions), no cache; values keyed like the engine's."""
    model, pad = s.model, int(s.tok.pad_token_id)
    tok = s.tok if config.removal != "delete" else None
    values: dict[tuple[str, str, str, str], float] = {}
    times: dict[str, Timing] = {}
    grid = [(F.k_label(k), lambda n, k=int(k): min(k, n)) for k in config.ks] + [
        (F.k_label(f), lambda n, f=f: n_words_for_fraction(f, n)) for f in config.eraser_grid
    ]
    p_full: dict[str, float] = {}
    target: dict[str, int] = {}

    def full() -> None:
        for e in items:
            if e.sample_id not in p_full:
                p = probs_padded(model, [e.seg.input_ids], pad)[0]
                target[e.sample_id] = int(np.argmax(p))
                p_full[e.sample_id] = float(p[target[e.sample_id]])

    def top_k(name: str, make: Callable[[F.Explanation, int], list[int]], fn: Any) -> None:
        for e in items:
            seqs = [make(e, how(e.seg.n_words)) for _, how in grid]
            p = probs_padded(model, seqs, pad)[:, target[e.sample_id]]
            for (lab, _), v in zip(grid, fn(p_full[e.sample_id], p)):
                values[(e.sample_id, e.method, name, lab)] = float(v)

    def aopc(name: str, most_first: bool) -> None:
        for e in items:
            order = e.order if most_first else e.order[::-1]
            seqs = [
                F.without_words(e.seg, order[: min(k, e.seg.n_words)], config.removal, tok)
                for k in range(1, config.aopc_k + 1)
            ]
            p = probs_padded(model, seqs, pad)[:, target[e.sample_id]]
            values[(e.sample_id, e.method, name, "")] = float(F.aopc(p_full[e.sample_id], p))

    def switching() -> None:
        for e in items:
            limit = max(1, math.ceil(config.switching.max_fraction * e.seg.n_words - 1e-9))
            preds: list[int] = []
            lo = 1
            while True:
                hi = min(lo + config.switching.chunk - 1, limit)
                seqs = [
                    F.without_words(e.seg, e.order[:k], config.removal, tok)
                    for k in range(lo, hi + 1)
                ]
                chunk = probs_padded(model, seqs, pad).argmax(1)
                preds.extend(int(c) for c in chunk)
                if (chunk != target[e.sample_id]).any() or hi >= limit:
                    break
                lo = hi + 1
            v, _ = F.switching_point(preds, target[e.sample_id], e.seg.n_words)
            values[(e.sample_id, e.method, F.SWITCHING_POINT, "")] = v

    def log_odds() -> None:
        f = config.log_odds_fraction
        for e in items:
            k = n_words_for_fraction(f, e.seg.n_words)
            seq = F.without_words(e.seg, e.order[:k], config.removal, tok)
            p = probs_padded(model, [seq], pad)[0, target[e.sample_id]]
            key = (e.sample_id, e.method, F.LOG_ODDS_DROP, F.k_label(f))
            values[key] = float(F.log_odds_drop(p_full[e.sample_id], p))

    plan: list[tuple[str, Callable[[], None]]] = [
        ("full_text", full),
        (
            F.COMPREHENSIVENESS,
            lambda: top_k(
                F.COMPREHENSIVENESS,
                lambda e, k: F.without_words(e.seg, e.order[:k], config.removal, tok),
                F.comprehensiveness,
            ),
        ),
        (
            F.SUFFICIENCY,
            lambda: top_k(
                F.SUFFICIENCY,
                lambda e, k: F.only_words(
                    e.seg, e.order[:k], config.removal, tok, config.sufficiency_keep_other
                ),
                F.sufficiency,
            ),
        ),
        (F.AOPC_MOST, lambda: aopc(F.AOPC_MOST, True)),
        (F.AOPC_LEAST, lambda: aopc(F.AOPC_LEAST, False)),
        (F.SWITCHING_POINT, switching),
        (F.LOG_ODDS_DROP, log_odds),
    ]
    for name, fn in plan:
        times[name], _ = timed(fn, len(items))
    return times, values


def run_ferret(
    s: Setup, n: int, metrics_texts: int, metrics_n: int, lime_samples: int, ig_steps: int,
    python: Path, timeout: float,
) -> tuple[dict[str, Any] | None, str]:  # fmt: skip
    """Timings from :mod:`benchmarks.ferret_side` under ``python``, or why there are none."""
    if not python.is_file():
        return None, f"{python} missing: `make bench-ferret-env` creates it"
    with tempfile.TemporaryDirectory() as tmp:
        s.model.save_pretrained(tmp + "/model")
        s.tok.save_pretrained(tmp + "/model")
        job = {
            "model_dir": tmp + "/model",
            "texts": s.texts[:n],
            "targets": s.targets[:n],
            "metrics_n": metrics_n,
            "metrics_texts": metrics_texts,
            "lime_samples": lime_samples,
            "ig_steps": ig_steps,
            "threads": torch.get_num_threads(),
        }
        Path(tmp, "job.json").write_text(json.dumps(job))
        try:
            proc = subprocess.run(
                [str(python), str(ROOT / "benchmarks" / "ferret_side.py"), tmp + "/job.json",
                 tmp + "/out.json"],
                capture_output=True, text=True, timeout=timeout,
                env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            if Path(tmp, "out.json").is_file():  # what it measured before the timeout
                return json.loads(Path(tmp, "out.json").read_text()), ""
            return None, f"ferret side ran past {timeout:.0f} s"
        if proc.returncode != 0 or not Path(tmp, "out.json").is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return None, "ferret side failed: " + " | ".join(tail)
        return json.loads(Path(tmp, "out.json").read_text()), ""
