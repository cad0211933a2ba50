"""Attention as an explanation (docs/methods.md#attention): one eager forward pass per batch.

Attention weights have shape (layers, heads, query, key) per example. A token's
score is the attention its *key* position receives, averaged over heads and over the
real (non-padding) query positions — or only the ``[CLS]`` row with ``query: cls`` —
and then over layers: every layer for ``all_attention``, the last for
``last_attention``. ``aggregate: sum`` sums instead of averaging (the original crowd
study summed over layers, heads and queries; within one text that only rescales).
"""

from __future__ import annotations

import contextlib
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch
from transformers import PreTrainedModel

from saleval.attribution.base import (
    AttributionError,
    Batch,
    Texts,
    TokenAttributor,
    one_of,
    register,
)
from saleval.modeling.inference import BF16, autocast, parse_bf16, use_bf16

QUERIES = ("all", "cls")
AGGREGATES = ("mean", "sum")


@contextlib.contextmanager
def eager_attention(model: PreTrainedModel) -> Iterator[None]:
    """Run ``model`` with eager attention (sdpa returns no weights), restoring it after."""
    current = getattr(model.config, "_attn_implementation", "eager")
    if current == "eager":
        yield
        return
    if not hasattr(model, "set_attn_implementation"):
        raise AttributionError(
            f"attention methods need attn_implementation='eager' (model has {current!r}); "
            "load it with saleval.modeling.models.load_trained(..., attn_implementation='eager')"
        )
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(current)


def layer_scores(
    attentions: torch.Tensor, attention_mask: torch.Tensor, query: str = "all"
) -> torch.Tensor:
    """Attention received per layer ``(B, L, K)`` from weights ``(B, L, H, Q, K)``: summed
    over heads and over the real query positions (only position 0 with ``query: cls``)."""
    one_of("query", query, QUERIES)
    att = attentions.float()
    if query == "cls":
        return att[:, :, :, 0, :].sum(2)
    qmask = attention_mask.to(att.dtype)[:, None, None, :, None]  # (B, 1, 1, Q, 1)
    return (att * qmask).sum(dim=(2, 3))


def combine_layers(
    per_layer: torch.Tensor,
    attention_mask: torch.Tensor,
    n_heads: int,
    query: str = "all",
    aggregate: str = "mean",
) -> torch.Tensor:
    """Token scores ``(B, K)`` from :func:`layer_scores` of the chosen layers: summed, or
    averaged over layers, heads and queries (``aggregate: mean``)."""
    one_of("aggregate", aggregate, AGGREGATES)
    summed = per_layer.sum(1)  # (B, K)
    if aggregate == "sum":
        return summed
    if query == "cls":
        n_query = torch.ones_like(attention_mask[:, :1], dtype=summed.dtype)
    else:
        n_query = attention_mask.to(summed.dtype).sum(1, keepdim=True)  # (B, 1)
    return summed / (per_layer.shape[1] * n_heads * n_query)


def attention_token_scores(
    attentions: torch.Tensor,
    attention_mask: torch.Tensor,
    query: str = "all",
    aggregate: str = "mean",
) -> torch.Tensor:
    """Token scores ``(B, K)`` from attention weights ``(B, L, H, Q, K)`` (docs/methods.md).

    Heads and (real) query positions, then layers, are averaged (``aggregate: mean``)
    or summed (``sum``); ``query: cls`` keeps only query position 0.
    """
    one_of("aggregate", aggregate, AGGREGATES)
    per_layer = layer_scores(attentions, attention_mask, query)
    return combine_layers(per_layer, attention_mask, attentions.shape[2], query, aggregate)


#: per model, the per-layer scores of its recent batches: ``all_attention`` and
#: ``last_attention`` read the same eager forward pass, which then runs once
#: (docs/methods.md#reuse); keyed by the batch's exact ids, the query rule and bf16
_SHARED: weakref.WeakKeyDictionary[torch.nn.Module, OrderedDict[tuple[Any, ...], torch.Tensor]]
_SHARED = weakref.WeakKeyDictionary()
_SHARED_BATCHES = 512  # batches remembered per model (a few MB even at 512 tokens)


class _Attention(TokenAttributor):
    needs_attention_weights = True
    layers = "all"

    def __init__(
        self, *, query: str = "all", aggregate: str = "mean", bf16: BF16 = False, **kw: object
    ):
        super().__init__(**kw)  # type: ignore[arg-type]
        self.query = one_of("query", query, QUERIES)
        self.aggregate = one_of("aggregate", aggregate, AGGREGATES)
        self.bf16 = parse_bf16(bf16)

    def per_layer(self, model: PreTrainedModel, batch: Batch) -> torch.Tensor:
        """:func:`layer_scores` of every layer for ``batch``, computed once per batch and
        shared by the attention methods (``_SHARED``)."""
        bf16 = use_bf16(batch.input_ids.device, self.bf16)
        # the parameters' version counters move on any in-place change of the weights
        weights = tuple(p._version for p in model.parameters())
        key = (batch.input_ids.cpu().numpy().tobytes(), tuple(batch.input_ids.shape),
               self.query, bf16, weights)  # fmt: skip
        memo = _SHARED.setdefault(model, OrderedDict())
        if key in memo:
            memo.move_to_end(key)
            return memo[key]
        with eager_attention(model), torch.no_grad(), autocast(batch.input_ids.device, bf16):
            out = model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                token_type_ids=batch.token_type_ids,
                output_attentions=True,
            )
        atts = out.attentions
        if not atts or any(a is None for a in atts):
            raise AttributionError(
                "the model returned no attention weights; build it with attn_implementation='eager'"
            )
        memo[key] = layer_scores(torch.stack(list(atts), dim=1), batch.attention_mask, self.query)
        while len(memo) > _SHARED_BATCHES:
            memo.popitem(last=False)
        return memo[key]

    def token_scores(self, texts: Texts) -> torch.Tensor:
        per_layer = self.per_layer(texts.model, texts.padded)
        chosen = per_layer if self.layers == "all" else per_layer[:, -1:]
        n_heads = int(texts.model.config.num_attention_heads)
        mask = texts.padded.attention_mask
        return combine_layers(chosen, mask, n_heads, self.query, self.aggregate)


@register("all_attention")
class AllAttention(_Attention):
    """Attention received per token, averaged over every layer, head and query."""

    layers = "all"


@register("last_attention")
class LastAttention(_Attention):
    """Attention received per token in the last layer, averaged over heads and queries."""

    layers = "last"
