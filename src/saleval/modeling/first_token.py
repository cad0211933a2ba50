"""The last block at the first position only, for classifiers whose head reads nothing else.

A classifier that reads position 0 of its last hidden state (BERT's ``[CLS]`` through its
pooler, RoBERTa's and ELECTRA's heads on ``<s>``/``[CLS]``) never uses what its last block
computes at the other positions: the query projection, the attention output and the
feed-forward block there are work whose result nobody reads — a sixth of the FLOPs of the
embedded 6-layer MiniLM, forward and backward. For every pass that reads only the logits
(the gradient methods, IG, DeepLIFT, LIME, occlusion, the metrics) the last block is
therefore computed for that one row. Keys and values still come from every position, so the
logits, and every gradient with respect to the inputs, are the whole model's to float noise.

Which models get it is found from the model, not from its class:

* what its head reads, by :func:`saleval.modeling.interface.classifier_reads` — ``first``
  only (a decoder reads its last token, mean pooling every token: both run whole);
* whether its last block is laid out as a BERT layer (``attention.self`` with ``query``,
  ``key``, ``value``; ``attention.output``; ``feed_forward_chunk``): BERT, RoBERTa, ELECTRA
  and the families copied from them are; DistilBERT, DeBERTa (relative positions) and
  ModernBERT (rotary positions, local attention) are not and run whole;
* and, once per model, that the one-row block gives the whole model's logits on a padded
  probe batch — a family whose block looks like BERT's but computes something else (a
  layer norm before attention, say) is caught there and runs whole.

A newcomer's family needs nothing here: it runs whole until its last block has this
layout, and then it is checked before it is used (docs/extending.md#a-model-familys-quirk).
The attention methods read every row's weights and run the whole model.
"""

from __future__ import annotations

import contextlib
import importlib
import weakref
from collections.abc import Iterator
from typing import Any, cast

import torch
from torch import nn
from transformers import PreTrainedModel

from saleval.modeling.devices import model_device
from saleval.modeling.interface import (
    InterfaceError,
    blocks_of,
    classifier_reads,
    interface,
    probe_ids,
)

#: per model: whether its last block at the first position gives its logits (checked once)
_EXACT: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()
#: off inside :func:`whole_model` (the benchmark and the tests compare both paths)
_ENABLED = [True]


class FirstRowBlock(nn.Module):
    """A BERT-style block computed for the first row only (module docstring). The block's
    own modules and attention function compute it; only the rows differ."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
        *args: object, **kwargs: object,
    ) -> torch.Tensor:  # fmt: skip
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        block: Any = self.block  # laid out as a BERT layer (bert_layout)
        attn = block.attention.self
        b, t, _ = hidden_states.shape
        heads, size = attn.num_attention_heads, attn.attention_head_size
        first = hidden_states[:, :1]
        q = attn.query(first).view(b, 1, heads, size).transpose(1, 2)
        k = attn.key(hidden_states).view(b, t, heads, size).transpose(1, 2)
        v = attn.value(hidden_states).view(b, t, heads, size).transpose(1, 2)
        if attention_mask is not None and attention_mask.dim() == 4:
            attention_mask = attention_mask[:, :, :1, :]
        eager = importlib.import_module(type(attn).__module__).eager_attention_forward
        fn = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation, eager)
        out, _ = fn(attn, q, k, v, attention_mask, dropout=0.0, scaling=attn.scaling)
        out = block.attention.output(out.reshape(b, 1, -1), first)
        return cast(torch.Tensor, block.feed_forward_chunk(out))


def bert_layout(block: nn.Module) -> bool:
    """Whether ``block`` is laid out as a BERT encoder layer that :class:`FirstRowBlock` can
    compute: self-attention only (no decoder, no cross-attention), absolute positions, an
    unchunked feed-forward, and its family's eager attention function to fall back on."""
    attn = getattr(getattr(block, "attention", None), "self", None)
    if attn is None or not hasattr(block.attention, "output"):
        return False
    needed = ("query", "key", "value", "num_attention_heads", "attention_head_size", "scaling")
    if not all(hasattr(attn, a) for a in (*needed, "config")):
        return False
    if getattr(attn, "position_embedding_type", "absolute") != "absolute":
        return False
    module = importlib.import_module(type(attn).__module__)
    return (
        callable(getattr(block, "feed_forward_chunk", None))
        and hasattr(module, "eager_attention_forward")
        and not getattr(block, "is_decoder", False)
        and not getattr(block, "add_cross_attention", False)
        and not getattr(block, "chunk_size_feed_forward", 0)
    )


def _last_block(model: PreTrainedModel) -> tuple[nn.ModuleList, int] | None:
    """The model's block list and its last index, where the one-row block applies to it
    (module docstring); None elsewhere, in training mode (dropout), or when it is active."""
    if not _ENABLED[0] or model.training:
        return None
    blocks = blocks_of(model)
    if blocks is None or not len(blocks) or not bert_layout(blocks[-1]):
        return None
    if model not in _EXACT:
        _EXACT[model] = _exact(model, blocks)
    return (blocks, len(blocks) - 1) if _EXACT[model] else None


def _exact(model: PreTrainedModel, blocks: nn.ModuleList) -> bool:
    """Whether the head reads position 0 alone and the one-row block gives the whole
    model's logits on a padded probe batch (fp32, to float noise)."""
    # classifier_reads takes gradients: callers may be inside inference mode
    with torch.inference_mode(False):
        try:
            if classifier_reads(model) != "first":
                return False
        except InterfaceError:
            return False
    iface = interface(model, None)
    ids = probe_ids(model, 6)[0].tolist()
    batch, mask = iface.pad([ids, ids[:3]], model_device(model))
    last = blocks[-1]
    with torch.no_grad():
        whole = model(**iface.inputs(batch, mask)).logits.float()
        blocks[-1] = FirstRowBlock(last)
        try:
            fast = model(**iface.inputs(batch, mask)).logits.float()
        except (RuntimeError, IndexError, ValueError):  # a block laid out otherwise after all
            return False
        finally:
            blocks[-1] = last
    scale = float(whole.abs().max().clamp_min(1e-6))
    return bool((fast - whole).abs().max() <= 1e-4 * scale)


@contextlib.contextmanager
def last_block_at_first_token(model: PreTrainedModel) -> Iterator[bool]:
    """Inside, ``model``'s last block is computed for the first position only where that is
    exact (module docstring); yields whether it is. A no-op for any other model, in
    training mode, inside :func:`whole_model`, or when already active. Only for passes that
    read the logits: the last block's attention weights and hidden states are not computed
    at the other positions."""
    found = _last_block(model)
    if found is None:
        yield False
        return
    blocks, i = found
    original = blocks[i]
    blocks[i] = FirstRowBlock(original)
    try:
        yield True
    finally:
        blocks[i] = original


@contextlib.contextmanager
def whole_model() -> Iterator[None]:
    """Every model runs whole inside (the fast path off): what the benchmark
    (``python -m benchmarks cls_only``) and the tests compare it with."""
    was = _ENABLED[0]
    _ENABLED[0] = False
    try:
        yield
    finally:
        _ENABLED[0] = was
