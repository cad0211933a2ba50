"""Batched forward passes over many token-id sequences (perturbations, deletions).

LIME, occlusion, the deletion metrics and the shortcut checks all push thousands
of variable-length id sequences through one model. Padding waste dominates on a
CPU, so sequences are sorted by length and packed into batches under a token
budget (long inputs get small batches, short ones large), then results are put
back in the caller's order. Optional bf16 autocast for these forward-only passes
(:func:`parse_bf16`): ``auto`` turns it on only where the hardware computes bf16 natively.

A model loaded with eager attention (the attention methods need its weights) runs
these passes, and every other method's, with PyTorch's fused ``sdpa`` attention
instead (:func:`attention_implementation`): same logits to float precision, and
measured 1.5× faster for gradients of the embedded MiniLM on a 2-core CPU
(``python -m benchmarks performance``).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from saleval.config.model import DEFAULT_MAX_BATCH, DEFAULT_MAX_TOKENS
from saleval.modeling.devices import model_device
from saleval.progress import bar


def n_labels_of(model: PreTrainedModel) -> int:
    """How many classes ``model`` scores (its ``config.num_labels``)."""
    n = model.config.num_labels
    if n is None:  # transformers types it Optional: a config without id2label
        raise ValueError(f"{type(model).__name__}: config has no num_labels; not a classifier")
    return int(n)


@dataclass
class PaddingTally:
    """Token slots of the batches run while the tally is active: ``real`` tokens and
    ``padded`` ones (padding to a batch's longest sequence), for benchmarks."""

    real: int = 0
    padded: int = 0

    @property
    def fraction(self) -> float:
        """Padded share of all token slots (0 when nothing ran)."""
        return self.padded / max(self.real + self.padded, 1)


_TALLIES: list[PaddingTally] = []


@contextlib.contextmanager
def padding_tally() -> Iterator[PaddingTally]:
    """Count the real and padded token slots of every batch built inside the block.

    >>> with padding_tally() as t:
    ...     count_padding([3, 5], width=5)
    >>> t.real, t.padded, round(t.fraction, 2)
    (8, 2, 0.2)
    """
    tally = PaddingTally()
    _TALLIES.append(tally)
    try:
        yield tally
    finally:
        _TALLIES.remove(tally)


def count_padding(lengths: Sequence[int], width: int) -> None:
    """Report one right-padded batch of ``lengths`` at ``width`` to the active tallies."""
    if _TALLIES:
        real = int(sum(lengths))
        for tally in _TALLIES:
            tally.real += real
            tally.padded += width * len(lengths) - real


def length_groups(
    lengths: Sequence[int], max_items: int, max_padding: float = 1.0
) -> list[np.ndarray]:
    """Indices sorted by length and cut into groups of at most ``max_items`` whose padding
    stays within ``max_padding`` of the group's token slots.

    Why: a method whose cost per example is already a large batch (IG's steps) gains
    nothing from joining texts of other lengths and pays for their padding; ``0`` joins
    only texts of equal length, ``1`` cuts by count alone (docs/methods.md#batching).

    >>> [g.tolist() for g in length_groups([5, 3, 5, 9], 4, max_padding=0.0)]
    [[1], [0, 2], [3]]
    >>> [g.tolist() for g in length_groups([5, 3, 5, 9], 4)]
    [[1, 0, 2, 3]]
    """
    if not 0.0 <= max_padding <= 1.0:
        raise ValueError(f"max_padding must lie in [0, 1], got {max_padding}")
    order = np.argsort(np.asarray(lengths), kind="stable")
    groups: list[np.ndarray] = []
    group: list[int] = []
    real = 0
    for i in order:
        n = int(lengths[i])
        slots = n * (len(group) + 1)  # sorted: the newcomer is the group's longest
        if group and (len(group) >= max_items or slots - real - n > max_padding * slots):
            groups.append(np.asarray(group))
            group, real = [], 0
        group.append(int(i))
        real += n
    if group:
        groups.append(np.asarray(group))
    return groups


#: a forward batch that already holds this many token slots is cut before a sequence that
#: would raise its padding past :data:`BATCH_MAX_PADDING` (smaller batches are not cut:
#: short sequences gain more from sharing a batch than they lose to padding). Measured
#: (2026-11-24, native-bf16 host, 16 AG News texts): occlusion's 611 inputs 4.55 s at
#: 7.5 % padding without the cut, 4.31 s at 1.6 % with it; 1,152 sufficiency-like inputs
#: (top-k words only) 2.81 s at 15 % vs 2.19 s at 2.5 %; 0.1 / 1,024 and 0.25 lay between.
BATCH_MIN_TOKENS = 512
BATCH_MAX_PADDING = 0.05


def length_batches(
    lengths: Sequence[int],
    max_tokens: int,
    max_batch: int,
    max_padding: float = BATCH_MAX_PADDING,
    min_tokens: int = BATCH_MIN_TOKENS,
) -> Iterator[np.ndarray]:
    """Indices grouped into length-sorted batches of at most ``max_tokens`` padded tokens,
    cut early where a batch of ``min_tokens`` slots would pass ``max_padding``.

    >>> [b.tolist() for b in length_batches([4, 4, 9, 4], 64, 8, min_tokens=8)]
    [[0, 1, 3], [2]]
    """
    order = np.argsort(np.asarray(lengths), kind="stable")
    batch: list[int] = []
    longest = real = 0
    for i in order:
        n = int(lengths[i])
        slots = max(longest, n) * (len(batch) + 1)
        full = slots > max_tokens or len(batch) >= max_batch
        padded = longest * len(batch) >= min_tokens and slots - real - n > max_padding * slots
        if batch and (full or padded):
            yield np.asarray(batch)
            batch, longest, real = [], 0, 0
        batch.append(int(i))
        longest = max(longest, n)
        real += n
    if batch:
        yield np.asarray(batch)


@contextlib.contextmanager
def attention_implementation(model: PreTrainedModel, impl: str = "sdpa") -> Iterator[None]:
    """Run ``model`` with attention implementation ``impl``, restoring the old one after.

    A no-op when the model already uses ``impl`` or cannot switch (no
    ``set_attn_implementation``, or the backend refuses): only speed depends on it.
    """
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current is None or current == impl or not hasattr(model, "set_attn_implementation"):
        yield
        return
    try:
        model.set_attn_implementation(impl)
    except (ValueError, ImportError, NotImplementedError):
        yield
        return
    try:
        yield
    finally:
        model.set_attn_implementation(current)


BF16 = bool | Literal["auto"]
_warned_emulated = False


def parse_bf16(value: object, where: str = "bf16") -> BF16:
    """A ``bf16`` option: ``true``, ``false`` or ``auto`` (bf16 only on native hardware)."""
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    if isinstance(value, str) and value.lower() in ("auto", "true", "false"):
        return "auto" if value.lower() == "auto" else value.lower() == "true"
    raise ValueError(f"{where} must be true, false or auto, got {value!r}")


def bf16_native(device: torch.device) -> bool:
    """Whether ``device`` computes bf16 matmuls in hardware.

    Why it matters: a CPU without AVX512-BF16/AMX emulates them, and bf16 autocast then
    runs the embedded MiniLM's forward passes ~8× *slower* than fp32 (measured on a
    2-core AVX2 EPYC: 1,000 LIME perturbations 36 s vs 4.5 s), where a CPU with native
    bf16 runs them ~2× faster.
    """
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if device.type == "cpu":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def use_bf16(device: torch.device, bf16: object) -> bool:
    """Resolve a ``bf16`` option on ``device``; warn once when forced bf16 is emulated."""
    global _warned_emulated
    mode = parse_bf16(bf16)
    if mode == "auto":
        return bf16_native(device)
    if mode and not bf16_native(device) and not _warned_emulated:
        _warned_emulated = True
        warnings.warn(
            f"bf16: true on a {device.type} without native bf16: autocast is emulated and "
            "much slower than fp32 here (bf16: auto uses bf16 only where it is native)",
            stacklevel=2,
        )
    return bool(mode)


def autocast(device: torch.device, bf16: object) -> contextlib.AbstractContextManager:
    """bf16 autocast per :func:`use_bf16`, else a no-op."""
    if not use_bf16(device, bf16):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def forward_logits(
    model: PreTrainedModel,
    sequences: Sequence[Sequence[int]],
    *,
    tokenizer: PreTrainedTokenizerFast | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    max_batch: int = DEFAULT_MAX_BATCH,
    bf16: BF16 = False,
    progress: bool = False,
    desc: str = "forward",
) -> np.ndarray:
    """Logits (float32, caller's order) for every id sequence; ``bf16`` per :func:`use_bf16`.

    The model is fed as ``tokenizer`` feeds it and right-padded with its own pad id
    (:func:`saleval.modeling.interface.interface`); that padding leaves every text's logits
    as they are alone is checked once per model first
    (:func:`saleval.modeling.interface.check_padding`).
    """
    from saleval.modeling.interface import check_padding

    check_padding(model, tokenizer, sequences)
    return _forward_logits(model, sequences, tokenizer, max_tokens, max_batch, bf16, progress, desc)


@torch.inference_mode()
def _forward_logits(
    model: PreTrainedModel,
    sequences: Sequence[Sequence[int]],
    tokenizer: PreTrainedTokenizerFast | None,
    max_tokens: int,
    max_batch: int,
    bf16: BF16,
    progress: bool,
    desc: str,
) -> np.ndarray:
    from saleval.modeling.first_token import last_block_at_first_token
    from saleval.modeling.interface import interface

    device = model_device(model)
    lengths = [len(s) for s in sequences]
    n_labels = n_labels_of(model)
    out = np.empty((len(sequences), n_labels), dtype=np.float32)
    if not sequences:
        return out
    feed = interface(model, tokenizer)
    batches = list(length_batches(lengths, max_tokens, max_batch))
    bf16 = use_bf16(device, bf16)  # resolve `auto` once, not per batch
    with attention_implementation(model, "sdpa"), last_block_at_first_token(model):
        for idx in bar(batches, desc=desc, disable=not progress, leave=False):
            count_padding([lengths[i] for i in idx], max(lengths[i] for i in idx))
            ids, mask = feed.pad([sequences[i] for i in idx], device)
            with autocast(device, bf16):
                logits = model(**feed.inputs(ids, mask)).logits
            out[idx] = logits.float().cpu().numpy()
    return out


def predict_proba(
    model: PreTrainedModel, sequences: Sequence[Sequence[int]], **kwargs: object
) -> np.ndarray:
    """Class probabilities for every id sequence (softmax of :func:`forward_logits`)."""
    logits = forward_logits(model, sequences, **kwargs)  # type: ignore[arg-type]
    logits = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    return p / p.sum(axis=1, keepdims=True)
