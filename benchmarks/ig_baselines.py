"""``python -m benchmarks.ig_baselines RUN_DIR [n]``: how much IG's ``zero_all`` baseline
moves the ``lu2024`` preset's word scores against ``zero`` (docs/benchmarks.md).

IG exactly as ``method=preset/lu2024`` configures it (100 Gauss-Legendre steps, logits,
embeddings layer, first piece per word), once with each baseline, on the first ``n``
SST-2 test texts, for the model's predicted class. Per text: Spearman's rho of the two
word-score vectors and the overlap |top_k ∩ top_k'| / k of their rankings
(:func:`saleval.words.rank_words`, the one ranking every stage uses).
"""

from __future__ import annotations

import platform
import sys
import time
from datetime import UTC, datetime

import numpy as np
from omegaconf import OmegaConf
from scipy.stats import spearmanr

from saleval.attribution import attribute_words
from saleval.modeling import inference
from saleval.modeling.data import load_dataset
from saleval.modeling.models import load_trained
from saleval.words import rank_words, segment

KS = (1, 3, 5)


def main(argv: list[str]) -> int:
    from benchmarks.common import compose

    run_dir, n = argv[0], int(argv[1]) if len(argv) > 1 else 30
    cfg = compose(["method=preset/lu2024", "dataset=sst2"])
    methods = OmegaConf.to_container(cfg.method, resolve=True)
    assert isinstance(methods, dict)
    ig = dict(methods["integrated_gradients"])
    model, tok = load_trained(run_dir)
    max_length = int(OmegaConf.load(f"{run_dir}/config.yaml").model.max_length)
    texts = load_dataset(cfg.dataset)["test"]["text"].head(n).tolist()
    segs = [s for s in (segment(t, tok, max_length) for t in texts) if s.n_words >= 2]
    preds = inference.forward_logits(model, [s.input_ids for s in segs]).argmax(1).tolist()
    scores, secs = {}, {}
    for base in ("zero", "zero_all"):
        t0 = time.perf_counter()
        scores[base] = attribute_words(model, tok, segs, preds, {**ig, "baseline": base})
        secs[base] = time.perf_counter() - t0
    rho, overlap = [], {k: [] for k in KS}
    for a, b in zip(scores["zero"], scores["zero_all"]):
        rho.append(float(spearmanr(a, b).statistic))
        ra, rb = rank_words(a), rank_words(b)
        for k in KS:
            kk = min(k, len(a))
            overlap[k].append(len(set(ra[:kk]) & set(rb[:kk])) / kk)
    rho_arr = np.asarray(rho)
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, host {platform.node()}, {len(segs)} texts")
    print(
        f"spearman zero vs zero_all: mean {np.nanmean(rho_arr):.3f}, median "
        f"{np.nanmedian(rho_arr):.3f}, min {np.nanmin(rho_arr):.3f}"
    )
    for k in KS:
        print(f"top-{k} overlap: {np.mean(overlap[k]):.3f}")
    print("seconds:", {k: round(v, 1) for k, v in secs.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
