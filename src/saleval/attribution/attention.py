"""Attention as an explanation (docs/methods.md#attention): one eager forward pass per batch.

Attention weights have shape (layers, heads, query, key) per example. A token's
score is the attention its *key* position receives, averaged over heads and over the
query rows ``query`` picks, and then over layers: every layer for ``all_attention``, the
last for ``last_attention``. ``aggregate: sum`` sums instead of averaging (the original
crowd study summed over layers, heads and queries; within one text that only rescales).

Query rows: ``all`` (every real position), ``cls`` (position 0, BERT's ``[CLS]``),
``output`` (the positions the classifier reads, found through the model:
:func:`saleval.modeling.interface.classifier_reads` — the first token of a BERT-style
encoder, the last non-pad token of a decoder, every token under mean pooling) and
``auto``, the default: ``all`` for encoders, ``output`` for decoders. Under a causal mask
row *q* sees only keys ≤ *q*, so averaging every row ranks words by position (a ramp),
and row 0 sees only itself: ``cls`` on a decoder is an error.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from saleval.attribution.base import (
    AttributionError,
    Batch,
    Texts,
    TokenAttributor,
    one_of,
    register,
)
from saleval.errors import warn_once
from saleval.modeling.inference import BF16, autocast, parse_bf16, use_bf16
from saleval.modeling.interface import Reads, classifier_reads, read_weights

log = logging.getLogger(__name__)

QUERIES = ("auto", "all", "cls", "output")
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
    attentions: torch.Tensor,
    attention_mask: torch.Tensor,
    query: str = "all",
    reads: Reads = "first",
) -> torch.Tensor:
    """Attention received per layer ``(B, L, K)`` from weights ``(B, L, H, Q, K)``: summed
    over heads and over the query rows ``query`` picks — the real positions (``all``),
    position 0 (``cls``), or the rows the classifier reads (``output``, weighted by
    :func:`saleval.modeling.interface.read_weights` of ``reads``: each text's rows sum to 1)."""
    one_of("query", query, QUERIES[1:])
    att = attentions.float()
    if query == "cls":
        return att[:, :, :, 0, :].sum(2)
    if query == "output":
        w = read_weights(reads, attention_mask).to(att.dtype)[:, None, None, :, None]
        return (att * w).sum(dim=(2, 3))
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
    if query in ("cls", "output"):  # one row, or rows weighted to sum to one
        n_query = torch.ones_like(attention_mask[:, :1], dtype=summed.dtype)
    else:
        n_query = attention_mask.to(summed.dtype).sum(1, keepdim=True)  # (B, 1)
    return summed / (per_layer.shape[1] * n_heads * n_query)


def attention_token_scores(
    attentions: torch.Tensor,
    attention_mask: torch.Tensor,
    query: str = "all",
    aggregate: str = "mean",
    reads: Reads = "first",
) -> torch.Tensor:
    """Token scores ``(B, K)`` from attention weights ``(B, L, H, Q, K)`` (docs/methods.md).

    Heads and the chosen query rows, then layers, are averaged (``aggregate: mean``) or
    summed (``sum``); ``query`` as in :func:`layer_scores`.
    """
    one_of("aggregate", aggregate, AGGREGATES)
    per_layer = layer_scores(attentions, attention_mask, query, reads)
    return combine_layers(per_layer, attention_mask, attentions.shape[2], query, aggregate)


def resolve_query(query: str, reads: Reads, model_class: str, warn: bool = True) -> str:
    """The query rows ``query`` means for a classifier that reads ``reads``.

    ``auto`` is ``all`` for an encoder and ``output`` for a decoder (``reads == "last"``);
    ``cls`` on a decoder is an error: its row 0 sees only itself; ``all`` on a decoder is
    warned (with ``warn``), once per model class and process (:func:`saleval.errors.warn_once`).

    >>> resolve_query("auto", "first", "BertForSequenceClassification")
    'all'
    >>> resolve_query("auto", "last", "GPT2ForSequenceClassification")
    'output'
    """
    one_of("query", query, QUERIES)
    decoder = reads == "last"
    if query == "auto":
        return "output" if decoder else "all"
    if query == "cls" and decoder:
        raise AttributionError(
            f"query: cls reads row 0, which in {model_class} (a decoder: causal attention, "
            "classified from its last non-pad token) attends only to itself: use query: output "
            "(the row the classifier reads) or auto"
        )
    if query == "all" and decoder and warn:  # once per model class and process
        warn_once(
            log,
            "query: all on %s (a decoder): under its causal mask, averaging every query row "
            "ranks words by position; query: output reads the row the classifier reads",
            model_class,
        )
    return query


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
        self, *, query: str = "auto", aggregate: str = "mean", bf16: BF16 = False, **kw: object
    ):
        super().__init__(**kw)  # type: ignore[arg-type]
        self.query = one_of("query", query, QUERIES)
        self.aggregate = one_of("aggregate", aggregate, AGGREGATES)
        self.bf16 = parse_bf16(bf16)

    def prepare(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> None:
        """Resolve ``query`` for this model (:func:`resolve_query`) before any work."""
        resolve_query(self.query, classifier_reads(model, tokenizer), type(model).__name__)

    def rows(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> tuple[str, Reads]:
        """The rows ``query`` means for ``model``, and the positions its classifier reads
        (both remembered per model by :func:`saleval.modeling.interface.classifier_reads`)."""
        reads = classifier_reads(model, tokenizer)
        return resolve_query(self.query, reads, type(model).__name__, warn=False), reads

    def per_layer(
        self, model: PreTrainedModel, batch: Batch, query: str, reads: Reads
    ) -> torch.Tensor:
        """:func:`layer_scores` of every layer for ``batch``, computed once per batch and
        shared by the attention methods (``_SHARED``)."""
        bf16 = use_bf16(batch.input_ids.device, self.bf16)
        # the parameters' version counters move on any in-place change of the weights
        weights = tuple(p._version for p in model.parameters())
        key = (batch.input_ids.cpu().numpy().tobytes(), tuple(batch.input_ids.shape),
               query, reads, bf16, weights)  # fmt: skip
        memo = _SHARED.setdefault(model, OrderedDict())
        if key in memo:
            memo.move_to_end(key)
            return memo[key]
        with eager_attention(model), torch.no_grad(), autocast(batch.input_ids.device, bf16):
            out = model(**batch.inputs(), output_attentions=True)
        atts = out.attentions
        if not atts or any(a is None for a in atts):
            raise AttributionError(
                "the model returned no attention weights; build it with attn_implementation='eager'"
            )
        stacked = torch.stack(list(atts), dim=1)
        memo[key] = layer_scores(stacked, batch.attention_mask, query, reads)
        while len(memo) > _SHARED_BATCHES:
            memo.popitem(last=False)
        return memo[key]

    def token_scores(self, texts: Texts) -> torch.Tensor:
        query, reads = self.rows(texts.model, texts.tokenizer)
        per_layer = self.per_layer(texts.model, texts.padded, query, reads)
        chosen = per_layer if self.layers == "all" else per_layer[:, -1:]
        n_heads = int(texts.model.config.num_attention_heads)
        mask = texts.padded.attention_mask
        return combine_layers(chosen, mask, n_heads, query, self.aggregate)


@register("all_attention", display="All Attention", published="All_Attention", paper_order=1)
class AllAttention(_Attention):
    """Attention received per token, averaged over every layer, head and query."""

    layers = "all"


@register("last_attention", display="Last Attention", published="Last_Attention", paper_order=2)
class LastAttention(_Attention):
    """Attention received per token in the last layer, averaged over heads and queries."""

    layers = "last"
