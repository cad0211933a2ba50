"""The batched attribution engine against a naive per-example Captum / lime loop.

Same model (the embedded MiniLM with an untrained 4-way head: timing only), same 32
real AG News test texts, same settings on both sides:

* gradients, IG, DeepLIFT: Captum's layer methods on the embeddings module, one
  example at a time (IG: 50 steps, all at once as Captum's default; pad baseline);
* attention: one forward per example;
* occlusion: Captum ``FeatureAblation`` over word groups with the ``[UNK]`` baseline,
  one perturbation per forward (its default) vs the engine's ``perturbation: unk``;
* LIME: ``lime``'s ``LimeTextExplainer(bow=False, mask_string='[UNK]')`` with a
  ``classifier_fn`` that tokenizes the perturbed strings and runs them in chunks of 64
  vs the engine's ``perturbation: unk`` on token ids, length-sorted.

Prints examples/s of both and the speed-up per method, and — where the two compute
the same quantity — the largest score difference relative to the largest score.
``--ig-chunks`` times IG's ``internal_batch_size`` instead (the measured default).

    python -m benchmarks attribution [--n 32] [--lime-samples 200] [--ig-chunks]

LIME runs 200 samples by default (not the method's 1000) to keep the run short on a
small CPU; both sides use the same number, and the cost per sample is what differs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from torch import nn

from saleval import paths
from saleval import stage as _stage  # noqa: F401  (registers the config resolvers)
from saleval.attribution import build_method
from saleval.config import register_configs
from saleval.data import load_dataset
from saleval.models import build_model, load_tokenizer
from saleval.words import Segmentation, segment, token_to_word_scores


def _cfg(overrides: list[str], config_name: str = "explain") -> Any:
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(paths.conf_dir()), version_base="1.3"):
        return compose(config_name, overrides=overrides)


def setup(n: int) -> tuple[Any, Any, list[str], list[int]]:
    cfg = _cfg(["model=minilm", "dataset=ag_news"], "train")
    data = load_dataset(cfg.dataset)
    texts = data["test"]["text"].head(n).tolist()
    tok = load_tokenizer(cfg.model)
    model = build_model(cfg.model, data.label_names, attn_implementation="eager", seed=0).eval()
    with torch.no_grad():
        enc = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
        targets = model(**enc).logits.argmax(-1).tolist()
    return model, tok, texts, targets


class _Logits(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, attention_mask=mask).logits


def naive_token_scores(
    kind: str, model: Any, tok: Any, seg: Segmentation, target: int, settings: dict[str, Any]
) -> np.ndarray:
    """What a per-example Captum loop computes for one text (token scores)."""
    from captum.attr import (
        FeatureAblation,
        LayerDeepLift,
        LayerGradientXActivation,
        LayerIntegratedGradients,
    )

    ids = torch.tensor([seg.input_ids])
    mask = torch.ones_like(ids)
    emb = model.bert.embeddings
    f = _Logits(model)
    special = torch.tensor([seg.special])
    ref = torch.where(special, ids, torch.full_like(ids, tok.pad_token_id))
    if kind == "vanilla_gradient":
        g = LayerGradientXActivation(f, emb, multiply_by_inputs=False).attribute(
            ids, target=target, additional_forward_args=(mask,)
        )
        return g.abs().sum(-1)[0].detach().numpy()
    if kind == "input_x_gradient":
        a = LayerGradientXActivation(f, emb).attribute(
            ids, target=target, additional_forward_args=(mask,)
        )
        return a.sum(-1)[0].detach().numpy()
    if kind == "integrated_gradients":
        a = LayerIntegratedGradients(f, emb).attribute(
            ids, baselines=ref, target=target, additional_forward_args=(mask,),
            n_steps=settings["n_steps"],
        )  # fmt: skip
        return a.sum(-1)[0].detach().numpy()
    if kind == "deeplift":
        a = LayerDeepLift(f, emb).attribute(
            ids, baselines=ref, target=target, additional_forward_args=(mask,)
        )
        return a.sum(-1)[0].detach().numpy()
    if kind in ("all_attention", "last_attention"):
        with torch.no_grad():
            att = model(input_ids=ids, output_attentions=True).attentions
        chosen = att if kind == "all_attention" else att[-1:]
        return torch.stack(chosen).mean(dim=(0, 2, 3))[0].numpy()
    if kind == "occlusion":
        groups = torch.tensor([[w if w >= 0 else seg.n_words for w in seg.token_word]])
        with torch.no_grad():
            a = FeatureAblation(f).attribute(
                ids, baselines=tok.unk_token_id, target=target, additional_forward_args=(mask,),
                feature_mask=groups,
            )  # fmt: skip
        return a[0].numpy().astype(float)
    raise KeyError(kind)


def naive_lime(model: Any, tok: Any, text: str, target: int, num_samples: int) -> None:
    """lime's own text explainer over strings, re-tokenized by the classifier_fn."""
    from lime.lime_text import LimeTextExplainer

    def classifier_fn(strings: list[str]) -> np.ndarray:
        out = []
        for i in range(0, len(strings), 64):
            enc = tok(
                strings[i : i + 64], padding=True, truncation=True, max_length=256,
                return_tensors="pt",
            )  # fmt: skip
            with torch.no_grad():
                out.append(torch.softmax(model(**enc).logits, -1).numpy())
        return np.vstack(out)

    explainer = LimeTextExplainer(
        kernel_width=25, bow=False, mask_string=tok.unk_token, random_state=0
    )
    explainer.explain_instance(
        text, classifier_fn, labels=(target,), num_features=10_000, num_samples=num_samples
    )


def _timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall seconds, CPU seconds of this process, result). CPU time is the steadier
    figure on a shared machine: wall time there depends on the neighbours' load."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


def compare(args: argparse.Namespace) -> None:
    model, tok, texts, targets = setup(args.n)
    segs = [segment(t, tok, 256) for t in texts]
    n_tok = [s.n_tokens for s in segs]
    print(
        f"{len(texts)} AG News test texts, {min(n_tok)}-{max(n_tok)} tokens "
        f"(mean {np.mean(n_tok):.0f}); MiniLM-L6; torch threads {torch.get_num_threads()}"
    )
    ig = {"n_steps": 50}
    methods: dict[str, dict[str, Any]] = {
        "all_attention": {},
        "last_attention": {},
        "vanilla_gradient": {},
        "input_x_gradient": {},
        "integrated_gradients": {"baseline": "pad", **ig},
        "deeplift": {"baseline": "pad"},
        "occlusion": {"perturbation": "unk", "output": "logits"},
        "lime": {"perturbation": "unk", "num_samples": args.lime_samples},
    }
    rows = []
    for kind, settings in methods.items():
        if args.only and kind not in args.only:
            continue
        engine = build_method({"kind": kind, **settings})
        t_engine, c_engine, scores = _timed(lambda e=engine: e.attribute(model, tok, segs, targets))
        if kind == "lime":
            t_naive, c_naive, _ = _timed(
                lambda: [
                    naive_lime(model, tok, t, y, args.lime_samples) for t, y in zip(texts, targets)
                ]
            )
            agree = "n/a (lime's own word split)"
        else:
            t_naive, c_naive, naive = _timed(
                lambda k=kind, s=settings: [
                    naive_token_scores(k, model, tok, seg, y, s) for seg, y in zip(segs, targets)
                ]
            )
            reduce = "mean" if kind == "occlusion" else "sum"  # ablation repeats a word's value
            words = [token_to_word_scores(a, s, reduce) for a, s in zip(naive, segs)]
            diff = max(float(np.abs(a - b).max(initial=0)) for a, b in zip(scores, words))
            scale = max(float(np.abs(a).max(initial=0)) for a in scores)
            agree = f"{diff / max(scale, 1e-12):.1e}"
        n = len(texts)
        row = (kind, n / t_engine, n / t_naive, t_naive / t_engine, c_naive / c_engine, agree)
        rows.append(row)
        print(
            f"  {kind:22s} engine {row[1]:8.2f} ex/s   naive {row[2]:8.2f} ex/s   "
            f"wall x{row[3]:5.1f}   cpu x{row[4]:5.1f}   max|Δ|/max|s| {agree}",
            flush=True,
        )
    print()
    print(
        "| method | engine ex/s | naive ex/s | speed-up (wall) | speed-up (CPU time) "
        "| max abs diff / max abs score |"
    )
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for kind, e, nv, r, rc, agree in rows:
        print(f"| {kind} | {e:.2f} | {nv:.2f} | {r:.1f}x | {rc:.1f}x | {agree} |")


def ig_chunks(args: argparse.Namespace) -> None:
    """Wall time of IG (50 steps) per internal_batch_size (rows per forward/backward chunk)."""
    model, tok, texts, targets = setup(args.n)
    segs = [segment(t, tok, 256) for t in texts]
    print(f"IG n_steps=50 on {len(segs)} texts, batch_size {args.ig_batch} examples")
    print("| internal_batch_size (rows/chunk) | wall s | CPU s | examples/s |")
    print("| ---: | ---: | ---: | ---: |")
    for ibs in args.ig_sizes:
        m = build_method(
            {
                "kind": "integrated_gradients",
                "batch_size": args.ig_batch,
                "internal_batch_size": ibs,
            }
        )
        t, c, _ = _timed(lambda m=m: m.attribute(model, tok, segs, targets))
        label = "all (Captum default)" if ibs is None else str(ibs)
        print(f"| {label} | {t:.1f} | {c:.1f} | {len(segs) / t:.2f} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks attribution")
    p.add_argument("--n", type=int, default=32, help="number of AG News test texts")
    p.add_argument("--lime-samples", type=int, default=200, help="LIME num_samples on both sides")
    p.add_argument("--only", nargs="*", help="methods to run (default: all)")
    p.add_argument("--ig-chunks", action="store_true", help="time IG internal_batch_size")
    p.add_argument("--ig-batch", type=int, default=8, help="examples per IG batch (--ig-chunks)")
    p.add_argument(
        "--ig-sizes",
        type=lambda s: None if s == "all" else int(s),
        nargs="*",
        default=[None, 8, 16, 32, 64, 128, 256],
        help="internal_batch_size values to time (--ig-chunks; 'all' = Captum's default)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ig_chunks(args) if args.ig_chunks else compare(args)
    return 0
