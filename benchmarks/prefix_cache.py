"""``python -m benchmarks prefix_cache [--smoke] [--lm DIR]``: a prompted LLM's shared
prefix computed once against the whole prompt recomputed for every input (issue #51,
docs/benchmarks.md#prefix-cache).

An 8-shot SST-2 prompt (the instruction and eight worked examples before ``{text}``):
occlusion and LIME explain the same texts with the prefix cache on and off, side by side
in one process, and the largest difference between the two paths' logits (fp32) is
measured on every input occlusion feeds the model. Without ``--lm`` the LM is a random
Llama-shaped causal LM built here (timing and exactness do not depend on what the
weights learned); ``--lm`` takes a real one's directory.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from saleval.attribution import build_method
from saleval.config.model import ModelConfig, PromptConfig
from saleval.modeling import inference, prompted
from saleval.modeling.data import load_dataset
from saleval.words import segment

SIZES = {"smoke": (64, 2, 4, 128), "full": (512, 8, 8, 1376)}  # hidden, layers, heads, ffn


def random_lm(out: Path, corpus: list[str], size: str) -> Path:
    """A random Llama-shaped causal LM with a tokenizer trained on ``corpus``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from saleval.testing.prompted import causal_tokenizer

    hidden, layers, heads, ffn = SIZES[size]
    tok = causal_tokenizer("llama", corpus)
    conf = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
        intermediate_size=ffn, max_position_embeddings=2048,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(conf).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _timed(fn: Any, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks prefix_cache")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (the test suite)")
    ap.add_argument("--lm", help="a causal LM directory (default: a random one built here)")
    ap.add_argument("--texts", type=int, default=None)
    ap.add_argument("--shots", type=int, default=8)
    ap.add_argument("--lime-samples", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    args = ap.parse_args(argv)
    n_texts = args.texts or (3 if args.smoke else 8)
    lime_samples = args.lime_samples or (32 if args.smoke else 200)
    repeats = args.repeats or 1
    data = load_dataset(_sst2())
    train = data["train"].head(2000)
    with tempfile.TemporaryDirectory() as tmp:
        lm = args.lm or str(
            random_lm(Path(tmp) / "lm", train["text"].tolist(), "smoke" if args.smoke else "full")
        )
        node = ModelConfig(
            _target_="saleval.modeling.models.PromptedSource", name="prompted", pretrained=lm,
            prompt=PromptConfig(
                instruction="Classify the sentiment of each movie review as positive or negative.",
                template="Review: {text}\nSentiment:", shots=args.shots, chat_template="off",
            ),
        )  # fmt: skip
        model, tok, _ = prompted.build(node, lm, data.label_names, train)
        texts = data["validation"]["text"].head(n_texts).astype(str).tolist()
        segs = [segment(t, tok, 256) for t in texts]
        prefix = len(model.prefix_ids)
        mean_text = float(np.mean([sum(1 for s in g.special if not s) for g in segs]))
        targets = inference.forward_logits(
            model, [s.input_ids for s in segs], tokenizer=tok
        ).argmax(1)
        # exactness: every input occlusion feeds the model, both paths
        inputs: list[list[int]] = []
        hook = model.register_forward_pre_hook(
            lambda m, a, k: inputs.extend(
                r[: int(sum(mk))] for r, mk in zip(k["input_ids"].tolist(), k["attention_mask"].tolist())
            ) if "input_ids" in k else None,
            with_kwargs=True,
        )  # fmt: skip
        build_method({"kind": "occlusion"}).attribute(model, tok, segs, targets.tolist())
        hook.remove()
        model.use_prefix_cache = True
        on = inference.forward_logits(model, inputs, tokenizer=tok)
        model.use_prefix_cache = False
        off = inference.forward_logits(model, inputs, tokenizer=tok)
        gap = float(np.abs(on - off).max())
        rows = []
        for kind, conf in (("occlusion", {"kind": "occlusion"}),
                           ("lime", {"kind": "lime", "num_samples": lime_samples})):  # fmt: skip
            secs: dict[bool, float] = {}
            for _ in range(repeats):  # the two paths alternate, so load drifts hit both
                for cache in (False, True):
                    model.use_prefix_cache = cache
                    m = build_method(conf)
                    t = _timed(lambda m=m: m.attribute(model, tok, segs, targets.tolist()), 1)
                    secs[cache] = min(secs.get(cache, float("inf")), t)
            rows.append((kind, secs[False], secs[True]))
    print(
        f"Prefix cache, {args.shots}-shot SST-2 prompt: prefix {prefix} tokens, texts "
        f"{mean_text:.1f} tokens on average, {n_texts} texts; LM {'random ' + str(SIZES['smoke' if args.smoke else 'full']) if not args.lm else lm}; "
        f"host {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    )
    print("\n| method | whole prompt (s) | prefix cached (s) | speed-up |")
    print("|---|---|---|---|")
    for kind, off_s, on_s in rows:
        print(f"| {kind} | {off_s:.2f} | {on_s:.2f} | {off_s / max(on_s, 1e-9):.2f}× |")
    print(
        f"\nLargest logit difference, cached vs whole prompt, over {len(inputs)} occlusion inputs (fp32): {gap:.2e}"
    )
    return 0 if gap <= 1e-4 else 1


def _sst2() -> Any:
    from saleval.stages.run import compose_stage

    return compose_stage("train", ["dataset=sst2"]).dataset
