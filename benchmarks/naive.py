"""The naive reference of the nine methods: what a per-example loop over Captum and lime computes.

Every benchmark that sets the batched engine (:mod:`saleval.attribution`) against "the
naive loop" uses :func:`naive_method`, so they all time and check the same thing: one
example at a time, the libraries called as their documentation shows, no batching
across examples, no length sorting, no cache.

* random: the engine's own seeded generator (nothing to compute);
* all / last attention: one forward per example with ``output_attentions``, the mean
  over layers (all or the last), heads and queries;
* vanilla gradient, input×gradient: Captum ``LayerGradientXActivation`` on the
  embeddings module (|g| summed over the hidden size, or g·x summed);
* integrated gradients, DeepLIFT: Captum ``IntegratedGradients`` / ``DeepLift`` on the
  embeddings module's output, every IG step in one call (Captum's default);
* occlusion: one right-padded forward per example of the text and its n one-word
  removals, p(target | x) − p(target | x without w);
* LIME: ``lime``'s ``LimeTextExplainer`` over strings with a ``classifier_fn`` that
  tokenizes the perturbed strings and runs them in chunks of 64 (``mask_string=''``
  deletes the word, as ``removal: delete``).

**Baselines.** IG and DeepLIFT start from the **zero** embedding vector, with special
tokens keeping their own embedding: the engine's default (``baseline: zero`` in
``conf/method/integrated_gradients.yaml`` and ``deeplift.yaml``; see
:func:`saleval.attribution.gradient.make_baseline`). The reference mirrors the default
configuration only: :func:`check_settings` refuses a setting it does not implement
(another baseline, ``output: probs``, another layer or word reduction), so a benchmark
can never compare the engine with a reference that computes something else.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from saleval.attribution.base import sample_rng
from saleval.modeling.devices import model_device
from saleval.words import Segmentation, perturb_ids, token_to_word_scores

_GRADIENT = {"output": "logits", "layer": "embeddings", "word_reduce": "sum"}
_ATTENTION = {"query": "all", "aggregate": "mean", "word_reduce": "sum", "bf16": False}
#: per method, the settings the reference implements (any other value is refused)
MIRRORED: dict[str, dict[str, Any]] = {
    "random": {},
    "all_attention": _ATTENTION,
    "last_attention": _ATTENTION,
    "vanilla_gradient": {**_GRADIENT, "reduction": "l1"},
    "input_x_gradient": _GRADIENT,
    "integrated_gradients": {**_GRADIENT, "baseline": "zero"},
    "deeplift": {**_GRADIENT, "baseline": "zero"},
    "occlusion": {"output": "probs", "removal": "delete", "bf16": False},
    "lime": {"removal": "delete", "feature_selection": "none", "bf16": False},
}


#: settings that mean a mirrored value on the BERT encoders the benchmarks run:
#: ``query: auto`` is ``all`` on an encoder (docs/methods.md#query)
ENCODER_MEANS: dict[str, dict[Any, Any]] = {"query": {"auto": "all"}}


def check_settings(kind: str, settings: dict[str, Any]) -> None:
    """Refuse settings the reference does not implement (see :data:`MIRRORED`)."""
    if kind not in MIRRORED:
        raise KeyError(f"no naive reference for method {kind!r}; have {sorted(MIRRORED)}")
    for key, value in MIRRORED[kind].items():
        given = ENCODER_MEANS.get(key, {}).get(settings.get(key), settings.get(key))
        if key in settings and given != value:
            raise NotImplementedError(
                f"naive {kind}: {key}={settings[key]!r} is not mirrored (only {key}={value!r})"
            )


class EmbeddingsAsInput(nn.Module):
    """``f(embeds, ids)``: the classifier with its embeddings module's output set to
    ``embeds`` — how a Captum user attributes to the (post-LayerNorm) embeddings."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.emb = model.bert.embeddings

    def forward(self, embeds: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        handle = self.emb.register_forward_hook(lambda m, i, o: embeds)
        try:
            return self.model(input_ids=ids.expand(len(embeds), -1)).logits
        finally:
            handle.remove()


def probs_padded(model: Any, seqs: Sequence[Sequence[int]], pad: int) -> np.ndarray:
    """One right-padded forward of ``seqs`` as given (no sorting, no cache)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.as_tensor(list(s))
        mask[i, : len(s)] = 1
    dev = model_device(model)
    with torch.inference_mode():
        logits = model(input_ids=ids.to(dev), attention_mask=mask.to(dev)).logits
        return torch.softmax(logits, -1).cpu().numpy()


def naive_method(kind: str, model: Any, tok: Any, settings: dict[str, Any], text: str,
                 seg: Segmentation, target: int) -> np.ndarray:  # fmt: skip
    """Word scores of one text by method ``kind`` with ``settings`` (its method config)."""
    from captum.attr import DeepLift, IntegratedGradients, LayerGradientXActivation

    check_settings(kind, settings)
    if kind == "random":
        return sample_rng(int(settings["seed"]), text).uniform(size=seg.n_words)
    if kind == "lime":
        return naive_lime(model, tok, settings, text, target)
    if kind == "occlusion":
        seqs = [list(seg.input_ids)]
        for w in range(seg.n_words):
            keep = np.ones(seg.n_words, dtype=bool)
            keep[w] = False
            seqs.append(perturb_ids(seg, keep, settings["removal"], tok))
        p = probs_padded(model, seqs, int(tok.pad_token_id))[:, target]
        return p[0] - p[1:]
    dev = model_device(model)
    ids = torch.tensor([seg.input_ids], device=dev)
    if kind in ("all_attention", "last_attention"):
        with torch.no_grad():
            att = model(input_ids=ids, output_attentions=True).attentions
        chosen = att if kind == "all_attention" else att[-1:]
        tokens = torch.stack(chosen).mean(dim=(0, 2, 3))[0].cpu().numpy()
        return token_to_word_scores(tokens, seg, "sum")
    emb = model.bert.embeddings
    if kind in ("vanilla_gradient", "input_x_gradient"):

        def logits(i: torch.Tensor) -> torch.Tensor:
            return model(input_ids=i).logits

        a = LayerGradientXActivation(
            logits, emb, multiply_by_inputs=kind == "input_x_gradient"
        ).attribute(ids, target=target)
        tokens = a.abs().sum(-1) if kind == "vanilla_gradient" else a.sum(-1)
        return token_to_word_scores(tokens[0].detach().cpu().numpy(), seg, "sum")
    # IG and DeepLIFT from the zero baseline; special tokens keep their own embedding
    f = EmbeddingsAsInput(model)
    with torch.no_grad():
        x = emb(input_ids=ids)
    special = torch.tensor(seg.special, device=dev)[None, :, None]
    base = torch.where(special, x, torch.zeros_like(x))
    if kind == "integrated_gradients":
        a, _ = IntegratedGradients(f).attribute(
            x.requires_grad_(), baselines=base, target=target, additional_forward_args=(ids,),
            n_steps=int(settings["n_steps"]), method=settings["method"],
            return_convergence_delta=True,
        )  # fmt: skip
    elif kind == "deeplift":
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Setting forward, backward hooks")
            a, _ = DeepLift(f).attribute(
                x.requires_grad_(), baselines=base, target=target,
                additional_forward_args=(ids,), return_convergence_delta=True,
            )  # fmt: skip
    else:
        raise KeyError(kind)
    return token_to_word_scores(a.sum(-1)[0].detach().cpu().numpy(), seg, "sum")


def naive_lime(model: Any, tok: Any, settings: dict[str, Any], text: str,
               target: int) -> np.ndarray:  # fmt: skip
    """``lime``'s own text explainer over strings, re-tokenized by the classifier_fn.

    Its words are lime's own split of the text, not :mod:`saleval.words`: the scores
    are timed, not compared.
    """
    from lime.lime_text import LimeTextExplainer

    check_settings("lime", settings)
    dev = model_device(model)

    def classifier_fn(strings: list[str]) -> np.ndarray:
        out = []
        for i in range(0, len(strings), 64):
            enc = tok(strings[i : i + 64], padding=True, truncation=True, max_length=256,
                      return_tensors="pt").to(dev)  # fmt: skip
            with torch.inference_mode():
                out.append(torch.softmax(model(**enc).logits, -1).cpu().numpy())
        return np.vstack(out)

    explainer = LimeTextExplainer(
        kernel_width=float(settings["kernel_width"]), bow=False, mask_string="",
        feature_selection="none", random_state=int(settings["seed"]),
    )  # fmt: skip
    exp = explainer.explain_instance(
        text, classifier_fn, labels=(target,), num_features=10_000,
        num_samples=int(settings["num_samples"]), distance_metric=settings["distance"],
    )  # fmt: skip
    return np.array([w for _, w in sorted(exp.local_exp[target])])
