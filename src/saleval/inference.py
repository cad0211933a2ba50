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
from typing import Literal

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel


def n_labels_of(model: PreTrainedModel) -> int:
    """How many classes ``model`` scores (its ``config.num_labels``)."""
    n = model.config.num_labels
    if n is None:  # transformers types it Optional: a config without id2label
        raise ValueError(f"{type(model).__name__}: config has no num_labels; not a classifier")
    return int(n)


def length_batches(lengths: Sequence[int], max_tokens: int, max_batch: int) -> Iterator[np.ndarray]:
    """Indices grouped into length-sorted batches of at most ``max_tokens`` padded tokens."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    batch: list[int] = []
    longest = 0
    for i in order:
        n = int(lengths[i])
        if batch and (max(longest, n) * (len(batch) + 1) > max_tokens or len(batch) >= max_batch):
            yield np.asarray(batch)
            batch, longest = [], 0
        batch.append(int(i))
        longest = max(longest, n)
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


@torch.inference_mode()
def forward_logits(
    model: PreTrainedModel,
    sequences: Sequence[Sequence[int]],
    *,
    pad_token_id: int = 0,
    max_tokens: int = 8192,
    max_batch: int = 512,
    bf16: BF16 = False,
    progress: bool = False,
    desc: str = "forward",
) -> np.ndarray:
    """Logits (float32, caller's order) for every id sequence; ``bf16`` per :func:`use_bf16`."""
    device = next(model.parameters()).device
    lengths = [len(s) for s in sequences]
    n_labels = n_labels_of(model)
    out = np.empty((len(sequences), n_labels), dtype=np.float32)
    if not sequences:
        return out
    batches = list(length_batches(lengths, max_tokens, max_batch))
    bf16 = use_bf16(device, bf16)  # resolve `auto` once, not per batch
    with attention_implementation(model, "sdpa"):
        for idx in tqdm(batches, desc=desc, disable=not progress, leave=False):
            width = max(lengths[i] for i in idx)
            ids = torch.full((len(idx), width), pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            for row, i in enumerate(idx):
                seq = torch.as_tensor(sequences[i], dtype=torch.long)
                ids[row, : len(seq)] = seq
                mask[row, : len(seq)] = 1
            with autocast(device, bf16):
                logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
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
