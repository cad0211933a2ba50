"""Batched forward passes over many token-id sequences (perturbations, deletions).

LIME, occlusion, the deletion metrics and the shortcut checks all push thousands
of variable-length id sequences through one model. Padding waste dominates on a
CPU, so sequences are sorted by length and packed into batches under a token
budget (long inputs get small batches, short ones large), then results are put
back in the caller's order. Optional bf16 autocast for these forward-only passes.

A model loaded with eager attention (the attention methods need its weights) runs
these passes, and every other method's, with PyTorch's fused ``sdpa`` attention
instead (:func:`attention_implementation`): same logits to float precision, and
measured 1.5× faster for gradients of the embedded MiniLM on a 2-core CPU
(``python -m benchmarks performance``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel


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


def autocast(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager:
    if not bf16:
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
    bf16: bool = False,
    progress: bool = False,
    desc: str = "forward",
) -> np.ndarray:
    """Logits (float32, caller's order) for every id sequence."""
    device = next(model.parameters()).device
    lengths = [len(s) for s in sequences]
    n_labels = int(model.config.num_labels)
    out = np.empty((len(sequences), n_labels), dtype=np.float32)
    if not sequences:
        return out
    batches = list(length_batches(lengths, max_tokens, max_batch))
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
