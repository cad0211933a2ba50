"""The ferret side of ``python -m benchmarks performance``, run under ``.venv-ferret``.

ferret-xai 0.4.2 pins transformers < 5, captum < 0.8 and numpy < 2, which the main
venv cannot hold, so it lives in its own venv (``make bench-ferret-env``) and this
script runs there as a subprocess: it imports nothing from saleval.

    .venv-ferret/bin/python benchmarks/ferret_side.py job.json out.json

``job.json`` (written by the main benchmark): ``model_dir`` (the same model, saved with
``save_pretrained``), ``texts``, ``targets``, ``metrics_n`` explanations over the first
``metrics_texts`` texts, ``lime_samples``,
``ig_steps``, ``threads``. ``out.json``: ``{"timings": {name: {"wall", "cpu", "n"}},
"versions": {...}}``. Every explainer is called per text, as ferret's ``Benchmark``
does, with the main side's method settings (LIME samples, IG steps) and ferret's
defaults otherwise.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any


def _timed(fn: Callable[[], Any], n: int) -> dict[str, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0, "n": n}


def main(job_path: str, out_path: str) -> int:
    warnings.filterwarnings("ignore")
    import captum
    import numpy as np
    import torch
    import transformers
    from ferret import GradientExplainer, IntegratedGradientExplainer, LIMEExplainer
    from ferret.evaluators.faithfulness_measures import (
        AOPC_Comprehensiveness_Evaluation,
        AOPC_Sufficiency_Evaluation,
        TauLOO_Evaluation,
    )
    from ferret.explainers.explanation import Explanation
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    with open(job_path) as fh:
        job = json.load(fh)
    torch.set_num_threads(int(job["threads"]))
    # ferret has no attention explainer: the model loads as Hugging Face's default (sdpa)
    model = AutoModelForSequenceClassification.from_pretrained(job["model_dir"]).eval()
    tok = AutoTokenizer.from_pretrained(job["model_dir"])
    texts, targets = job["texts"], [int(t) for t in job["targets"]]
    n = len(texts)
    timings: dict[str, dict[str, float]] = {}
    versions = {
        "ferret-xai": importlib.metadata.version("ferret-xai"),
        "transformers": transformers.__version__,
        "captum": captum.__version__,
        "torch": torch.__version__,
    }

    def save() -> None:
        """Write what is measured so far: a run cut short by the caller's timeout keeps it."""
        with open(out_path, "w") as fh:
            json.dump({"timings": timings, "versions": versions}, fh)

    def per_text(name: str, explainer: Any, **call_args: Any) -> None:
        def run() -> None:
            for t, y in zip(texts, targets):
                # a fresh dict per call: ferret pops its options out of call_args
                explainer(t, y, **({"call_args": dict(call_args)} if call_args else {}))

        timings[name] = _timed(run, n)
        save()
        print(f"ferret {name}: {n / timings[name]['wall']:.2f} ex/s", file=sys.stderr, flush=True)

    GradientExplainer(model, tok)(texts[0], targets[0])  # warm-up, as on the main side
    per_text("gradient", GradientExplainer(model, tok, multiply_by_inputs=False))
    per_text("gradient_x_input", GradientExplainer(model, tok, multiply_by_inputs=True))
    per_text(
        "integrated_gradients_x_input",
        IntegratedGradientExplainer(model, tok, multiply_by_inputs=True),
        n_steps=int(job["ig_steps"]),
    )
    loo = TauLOO_Evaluation(model, tok)
    timings["leave_one_out"] = _timed(
        lambda: [loo.compute_leave_one_out_occlusion(t, y) for t, y in zip(texts, targets)], n
    )
    save()

    # metrics: as many explanations as the main side evaluates (its first metrics_texts
    # texts, each with several explanations), here with random token scores
    m, mt = int(job["metrics_n"]), max(1, min(int(job["metrics_texts"]), n))
    rng = np.random.default_rng(0)
    expls = []
    for i in range(m):
        text, target = texts[i % mt], targets[i % mt]
        tokens = tok.convert_ids_to_tokens(tok(text, truncation=True)["input_ids"])
        expls.append(
            (Explanation(text, tokens, rng.uniform(size=len(tokens)), "r", target), target)
        )
    for name, cls in (
        ("aopc_comprehensiveness", AOPC_Comprehensiveness_Evaluation),
        ("aopc_sufficiency", AOPC_Sufficiency_Evaluation),
    ):
        ev = cls(model, tok)
        timings[name] = _timed(lambda ev=ev: [ev.compute_evaluation(e, y) for e, y in expls], m)
        save()
    # LIME last: the longest, so a caller's timeout still keeps everything else
    per_text("lime", LIMEExplainer(model, tok), num_samples=int(job["lime_samples"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
