"""Word-level saliency (docs/methods.md): every method, batched, on any device.

Two entry points for the other stages:

``attribute_words(model, tokenizer, segs, targets, method_cfg) -> list[np.ndarray]``
    One finite float score per *kept* word of every :class:`saleval.words.Segmentation`
    (same order as ``segs``; ``len(out[i]) == segs[i].n_words``). Higher = more
    important for ``targets[i]``. ``method_cfg`` is one entry of the ``method``
    config group (a mapping with ``_target_`` naming a class of this package, or a
    registry name, plus its settings), or an already-built :class:`Attributor`.

``explain_frame(model, tokenizer, df, methods, target="prediction", max_length=..., ...)``
    For a table with ``sample_id, text`` (and ``label``, needed for ``target="gold"``):
    predictions and word attributions of every configured method, as frames matching
    ``tables.PREDICTIONS`` and ``tables.ATTRIBUTIONS`` (``method`` = the method's unique
    name: its key in ``methods`` or an explicit ``name:`` in its config). ``max_length``
    defaults to :data:`saleval.config.model.DEFAULT_MAX_LENGTH`.
    :mod:`saleval.api` wraps it for notebooks (``docs/api.md``).

What a method is — how tables and plots name it, its name in the original study's
published results, its row in the paper's tables — is declared where it registers
(:func:`saleval.attribution.base.register`) and kept on its class; :func:`paper_methods`,
:func:`published_names` and :func:`known_methods` read it back without loading a method
(:mod:`saleval.attribution.catalog`): importing this package loads none of the methods'
libraries, a name below loads its module when first asked for.

Every method produces *token* scores over a padded batch; one shared step
(:func:`saleval.words.token_to_word_scores`) turns them into word scores, so no method
post-processes on its own (docs/methods.md#words).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from saleval.attribution.catalog import known_methods, paper_methods, published_names

__all__ = [
    "REGISTRY",
    "AllAttention",
    "AttributionError",
    "Attributor",
    "CaptumLime",
    "DeepLiftMethod",
    "InputXGradientMethod",
    "IntegratedGradientsMethod",
    "LastAttention",
    "Lime",
    "Occlusion",
    "RandomScores",
    "SelfExplain",
    "Texts",
    "TokenAttributor",
    "VanillaGradient",
    "attention_token_scores",
    "attribute_words",
    "build_method",
    "explain_frame",
    "known_methods",
    "method_name",
    "paper_methods",
    "published_names",
]

if TYPE_CHECKING:
    from saleval.attribution.attention import AllAttention, LastAttention, attention_token_scores
    from saleval.attribution.base import (
        AttributionError,
        Attributor,
        Texts,
        TokenAttributor,
        attribute_words,
        build_method,
        method_name,
    )
    from saleval.attribution.catalog import REGISTRY
    from saleval.attribution.frame import explain_frame
    from saleval.attribution.gradient import (
        DeepLiftMethod,
        InputXGradientMethod,
        IntegratedGradientsMethod,
        VanillaGradient,
    )
    from saleval.attribution.perturbation import CaptumLime, Lime, Occlusion
    from saleval.attribution.random import RandomScores
    from saleval.attribution.self_explain import SelfExplain

#: each module of the package and its names above, loaded when first asked for
_MODULES = {
    "attention": ("AllAttention", "LastAttention", "attention_token_scores"),
    "base": (
        "AttributionError",
        "Attributor",
        "Texts",
        "TokenAttributor",
        "attribute_words",
        "build_method",
        "method_name",
    ),
    "gradient": (
        "DeepLiftMethod",
        "InputXGradientMethod",
        "IntegratedGradientsMethod",
        "VanillaGradient",
    ),
    "perturbation": ("CaptumLime", "Lime", "Occlusion"),
    "random": ("RandomScores",),
    "self_explain": ("SelfExplain",),
    "frame": ("explain_frame",),
}
_LAZY = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    """The methods' code is loaded when first asked for: it loads torch, transformers,
    Captum and lime (seconds a process), and ``explain_frame``'s module Lightning, which a
    stage that only reads what the methods are (score, report, compare, a published
    file's import: :mod:`saleval.attribution.catalog`) never needs. ``REGISTRY`` is the
    registry with every built-in method loaded."""
    if name == "REGISTRY":
        from saleval.attribution.catalog import load_all

        return load_all()
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
