"""``python -m benchmarks.shortcut_gxi_ig [n_train] [n_explain] [override ...]``: why do GxI and IG from a
zero baseline rank the planted shortcut differently (docs/recipes.md#shortcut)?

A small-scale stand-in for the full protocol (which takes ~100 CPU minutes): the
``st`` shortcut planted into SST-2, the random 2-layer ``model=tiny`` trained on the
mixed data only (no original model, no verification thresholds: its synthetic
accuracy is printed instead), then GxI and IG variants that differ in one factor each —
baseline (``zero`` keeps [CLS]/[SEP], ``zero_all`` zeroes them too), steps, logits vs
probabilities, the attributed layer — scored in both units (word, piece) on the same
balanced synthetic test examples. Prints P@1 (Wilson interval) and mean rank per
configuration and unit, and the share of examples whose rank of the shortcut equals
GxI's (same output and layer): 1.0 would be the paper's "identical".
"""

from __future__ import annotations

import platform
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from saleval.shortcut import experiment as ex
from saleval.stages.run import compose_stage

GXI = "saleval.attribution.gradient.InputXGradientMethod"
IG = "saleval.attribution.gradient.IntegratedGradientsMethod"


def configs() -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for layer in ("embeddings", "word_embeddings"):
        tag = "" if layer == "embeddings" else "_wemb"
        for output in ("logits", "probs"):
            out[f"gxi_{output}{tag}"] = {"_target_": GXI, "output": output, "layer": layer}
            for base in ("zero", "zero_all"):
                for steps in (20, 100, 300):
                    if steps != 100 and (output != "logits" or layer != "embeddings"):
                        continue
                    out[f"ig_{base}_{steps}_{output}{tag}"] = {
                        "_target_": IG,
                        "baseline": base,
                        "n_steps": steps,
                        "output": output,
                        "layer": layer,
                        "batch_size": 8,
                    }
    return out


def main(argv: list[str]) -> int:
    n_train = int(argv[0]) if argv else 2000
    n_explain = int(argv[1]) if len(argv) > 1 else 50
    work = Path(tempfile.mkdtemp(prefix="gxi_ig_"))
    cfg = compose_stage(
        "shortcut",
        [
            "model=tiny",
            "trainer=smoke",
            "trainer.max_epochs=6",
            f"dataset.max_train={n_train}",
            "dataset.max_validation=400",
            "dataset.max_test=200",
            "shortcut.synthetic_test_size=200",
            "progress=false",
            f"paths.output_root={work}",
            *argv[2:],
        ],
    )
    data, tok = ex.prepare_data(cfg)
    model, _ = ex.train_classifier(
        cfg, data.rule, tok, data.label_names, data.mixed, work / "mixed"
    )
    max_length = int(cfg.model.max_length)
    acc_syn, pred = ex.accuracy(model, tok, data.synthetic_test, max_length)
    acc_test, _ = ex.accuracy(model, tok, data.original["test"], max_length)
    pool = ex.explain_pool(data.synthetic_test.assign(pred=pred), n_explain, int(cfg.seed))
    rows = []
    for unit in ("word", "piece"):
        summary, per = ex.saliency_sweep(
            model, tok, pool, pool["pred"].tolist(), configs(), max_length, False, unit
        )
        ranks = per.pivot(index="sample_id", columns="config", values="rank")

        def same_as_gxi(config: str, ranks: pd.DataFrame = ranks) -> float:
            out = "probs" if "probs" in config else "logits"
            gxi = f"gxi_{out}" + ("_wemb" if config.endswith("_wemb") else "")
            return float((ranks[config] == ranks[gxi]).mean())

        rows.append(summary.assign(same_rank_as_gxi=summary["config"].map(same_as_gxi)))
    res = pd.concat(rows, ignore_index=True)
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, host {platform.node()}")
    print(
        f"model=tiny, {n_train} SST-2 sentences + {cfg.shortcut.synthetic_fraction:.0%} st "
        f"shortcut, {cfg.trainer.max_epochs} epochs, lr {cfg.trainer.optimizer.lr}: "
        f"synthetic accuracy {acc_syn:.3f}, original test accuracy {acc_test:.3f}; "
        f"n = {len(pool)} synthetic test examples"
    )
    cols = ["config", "unit", "precision", "precision_ci_low", "precision_ci_high"]
    cols += ["mean_rank", "same_rank_as_gxi"]
    with pd.option_context("display.width", 200, "display.max_rows", 200):
        print(res[cols].round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    raise SystemExit(main(sys.argv[1:]))
