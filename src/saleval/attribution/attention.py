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
from collections.abc import Iterator

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from saleval.attribution.base import AttributionError, Batch, TokenAttributor, register
from saleval.inference import BF16, autocast, parse_bf16

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
            "load it with saleval.models.load_trained(..., attn_implementation='eager')"
        )
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(current)


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
    if query not in QUERIES:
        raise AttributionError(f"query must be one of {QUERIES}, got {query!r}")
    if aggregate not in AGGREGATES:
        raise AttributionError(f"aggregate must be one of {AGGREGATES}, got {aggregate!r}")
    att = attentions.float()
    if query == "cls":
        per_query = att[:, :, :, 0, :]  # (B, L, H, K)
        n_query = torch.ones_like(attention_mask[:, :1], dtype=att.dtype)
    else:
        qmask = attention_mask.to(att.dtype)[:, None, None, :, None]  # (B, 1, 1, Q, 1)
        per_query = (att * qmask).sum(3)  # (B, L, H, K)
        n_query = attention_mask.to(att.dtype).sum(1, keepdim=True)  # (B, 1)
    summed = per_query.sum(dim=(1, 2))  # (B, K)
    if aggregate == "sum":
        return summed
    n_layers, n_heads = att.shape[1], att.shape[2]
    return summed / (n_layers * n_heads * n_query)


class _Attention(TokenAttributor):
    forward_only = True
    needs_attention_weights = True
    layers = "all"

    def __init__(
        self, *, query: str = "all", aggregate: str = "mean", bf16: BF16 = False, **kw: object
    ):
        super().__init__(**kw)  # type: ignore[arg-type]
        if query not in QUERIES:
            raise AttributionError(f"query must be one of {QUERIES}, got {query!r}")
        if aggregate not in AGGREGATES:
            raise AttributionError(f"aggregate must be one of {AGGREGATES}, got {aggregate!r}")
        self.query = query
        self.aggregate = aggregate
        self.bf16 = parse_bf16(bf16)

    def attentions(self, model: PreTrainedModel, batch: Batch) -> torch.Tensor:
        """Stacked attention weights ``(B, L, H, Q, K)`` of the selected layers."""
        with eager_attention(model), torch.no_grad(), autocast(batch.input_ids.device, self.bf16):
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
        chosen = atts if self.layers == "all" else atts[-1:]
        return torch.stack(list(chosen), dim=1)

    def token_scores(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerFast,
        batch: Batch,
        targets: torch.Tensor,
    ) -> torch.Tensor:
        return attention_token_scores(
            self.attentions(model, batch), batch.attention_mask, self.query, self.aggregate
        )


@register("all_attention")
class AllAttention(_Attention):
    """Attention received per token, averaged over every layer, head and query."""

    layers = "all"


@register("last_attention")
class LastAttention(_Attention):
    """Attention received per token in the last layer, averaged over heads and queries."""

    layers = "last"
