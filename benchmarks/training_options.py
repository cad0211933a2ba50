"""Issue #39: the training defaults, old and new, side by side in one run.

``python -m benchmarks training_options [--root DIR] [-- saleval-train overrides]`` runs
``saleval-train`` with the default profile's train settings four times in one output
root: with the defaults before issue #39 (``trainer.precision=32-true
trainer.loader.length_grouped=false``), with each of the two changes alone, and with the
new defaults (length-grouped batches; ``precision: auto``, i.e. bf16-mixed where bf16 is
native) — and prints, per setting, the stage's seconds, the validation and test
accuracy, the padded share of the training batches' token slots (one seeded epoch of the
loader's own batches), and the new default's speed-up over the old one. On a host where
bf16 is emulated, ``auto`` is fp32 and the bf16-only row is left out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from benchmarks.paper_scale import host_line
from saleval.modeling.data import load_dataset
from saleval.modeling.inference import bf16_native
from saleval.modeling.models import load_tokenizer
from saleval.modeling.training import TextDataModule
from saleval.stages.run import compose_stage

ROOT = Path(__file__).resolve().parents[1]
OLD = ["trainer.precision=32-true", "trainer.loader.length_grouped=false"]
OPTIONS = {
    "old default (fp32, shuffled batches)": OLD,
    "length-grouped only": ["trainer.precision=32-true"],
    "bf16-mixed only": ["trainer.loader.length_grouped=false", "trainer.precision=bf16-mixed"],
    "new default (length-grouped, precision auto)": [],
}


def profile_overrides(profile: str = "default") -> list[str]:
    """The train stage's overrides of ``conf/profile/<profile>.yaml`` (the dataset and
    model included), as ``saleval-run`` passes them."""
    # the profile's own interpolations (``${profile.model}``) resolve under ``profile``
    node = OmegaConf.create(
        {"profile": OmegaConf.load(ROOT / "conf" / "profile" / f"{profile}.yaml")}
    ).profile
    given = [str(o) for o in node.stages.train]
    return list(dict.fromkeys([f"dataset={node.dataset}", f"model={node.model}", *given]))


def padded_share(overrides: list[str]) -> float:
    """Padded token slots ÷ all slots over one epoch of the train loader's batches."""
    cfg = compose_stage("train", overrides)
    data = load_dataset(cfg.dataset)
    dm = TextDataModule.from_config(
        {s: data[s] for s in ("train", "validation", "test")},
        load_tokenizer(cfg.model),
        int(cfg.model.max_length),
        cfg.trainer.loader,
        seed=int(cfg.seed),
    )
    dm.setup("fit")
    lengths = [len(item["input_ids"]) for item in dm.ds["train"].items]
    torch.manual_seed(int(cfg.seed))
    loader = dm.train_dataloader()
    assert loader.batch_sampler is not None
    slots = real = 0
    for batch in loader.batch_sampler:
        longest = max(lengths[i] for i in batch)
        slots += longest * len(batch)
        real += sum(lengths[i] for i in batch)
    return 1 - real / slots


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks training_options")
    ap.add_argument("--root", type=Path, default=None, help="output root (default: fresh)")
    ap.add_argument("rest", nargs="*", help="more saleval-train overrides")
    args = ap.parse_args(argv)
    root = args.root or ROOT / "outputs" / "training_options" / time.strftime("%Y%m%d-%H%M%S")
    base = [*profile_overrides(), *args.rest]
    print(f"host: {host_line()}", flush=True)
    options = dict(OPTIONS)
    if not bf16_native(torch.device("cpu")) and not torch.cuda.is_available():
        del options["bf16-mixed only"]
        print("bf16-mixed left out: bf16 is emulated on this host", flush=True)
    script = Path(sys.executable).parent / "saleval-train"
    rows = ["| option | seconds | val accuracy | test accuracy | padded train slots |",
            "| --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    seconds: dict[str, float] = {}
    for i, (name, extra) in enumerate(options.items()):
        run_dir = root / f"setting{i}"
        cmd = [str(script), f"paths.output_root={root}", f"run_dir={run_dir}", *base, *extra]
        print(" ".join(cmd), flush=True)
        code = subprocess.run(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"}).returncode
        if code != 0:
            raise SystemExit(f"{' '.join(cmd)} exited {code}")
        m = json.loads((run_dir / "metrics.json").read_text())
        pad = padded_share([*base, *extra])
        rows.append(
            f"| {name} | {m['seconds']:.1f} | {m['val_accuracy']:.4f} | "
            f"{m['test_accuracy']:.4f} | {pad:.1%} |"
        )
        print(rows[-1], flush=True)
        seconds[name] = float(m["seconds"])
    print(f"host after: {host_line()}\n")
    print("\n".join(rows))
    old, new = seconds[next(iter(options))], seconds[list(options)[-1]]
    print(f"\nnew default vs old default: {old / new:.2f}× faster ({old:.1f} s → {new:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
