"""\"The embeddings\" a gradient method attributes to, for every model family
(docs/methods.md#embeddings): the input to the first transformer block, built by the
model's own modules (word + position + token type where the model adds them), or the word
embeddings alone (``get_input_embeddings()``), found through the model rather than named
per family (docs/data-and-models.md#families).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from saleval.modeling.interface import (
    EMBEDDING_LAYERS,
    InterfaceError,
    blocks_of,
    interface,
    probe_ids,
)


class _Stop(Exception):
    """Raised by a capture hook: the rest of the forward pass is not needed."""


@dataclass(frozen=True)
class EmbeddingPoint:
    """A tensor inside the model's forward that a gradient method attributes to.

    ``where`` is ``output`` (the module's output is the tensor: a forward hook replaces
    it) or ``input`` (the tensor is the module's first input, ``hidden_states``: a
    forward pre-hook replaces it).
    """

    module: nn.Module
    name: str
    where: Literal["output", "input"]

    @contextlib.contextmanager
    def replaced(self, value: torch.Tensor) -> Iterator[None]:
        """Inside, the model computes on ``value`` in place of this tensor."""
        if self.where == "output":
            handle = self.module.register_forward_hook(lambda m, i, o: value)
        else:

            def pre(m: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
                if args:
                    return (value, *args[1:]), kwargs
                return args, {**kwargs, "hidden_states": value}

            handle = self.module.register_forward_pre_hook(pre, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()

    def capture(self, model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """This tensor for ``inputs`` (no gradient), running the model only up to it."""
        got: list[torch.Tensor] = []
        if self.where == "output":

            def hook(m: nn.Module, i: Any, o: Any) -> None:
                got.append(o.detach())
                raise _Stop

            handle = self.module.register_forward_hook(hook)
        else:

            def pre(m: nn.Module, args: tuple, kwargs: dict) -> None:
                got.append((args[0] if args else kwargs["hidden_states"]).detach())
                raise _Stop

            handle = self.module.register_forward_pre_hook(pre, with_kwargs=True)
        try:
            with torch.no_grad(), contextlib.suppress(_Stop):
                model(**inputs)
        finally:
            handle.remove()
        if not got:
            raise InterfaceError(f"{type(model).__name__}: {self.name} was never computed")
        return got[0]


_POINTS: weakref.WeakKeyDictionary[nn.Module, dict[str, EmbeddingPoint]] = (
    weakref.WeakKeyDictionary()
)


def embedding_point(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast | None, layer: str = "embeddings"
) -> EmbeddingPoint:
    """Where ``layer`` lives in ``model`` (docs/methods.md#embeddings).

    ``word_embeddings``: the output of ``get_input_embeddings()``. ``embeddings``: the input
    to the first block — the tensor the model returns as ``hidden_states[0]`` — found by
    running the model once with hooks of its own (removed after): the outermost module
    outside the blocks whose output *is* that tensor (BERT, RoBERTa, DeBERTa, DistilBERT, ModernBERT: the embeddings module;
    ELECTRA: its projection; GPT-2: the dropout after word + position embeddings; Llama:
    the token embeddings), or else the first block, whose input is replaced.
    """
    if layer not in EMBEDDING_LAYERS:
        raise InterfaceError(f"layer must be one of {EMBEDDING_LAYERS}, got {layer!r}")
    memo = _POINTS.setdefault(model, {})
    if layer in memo:
        return memo[layer]
    own = getattr(model, "explained_embeddings", None)
    if callable(own):  # a prompted LLM: its prompt's token embeddings, for both layers
        point = EmbeddingPoint(own(), "the prompt's token embeddings", "output")
    elif layer == "word_embeddings":
        point = EmbeddingPoint(model.get_input_embeddings(), "word embeddings", "output")
    else:
        point = _first_block_input(model, tokenizer)
    memo[layer] = point
    return point


def _first_block_input(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast | None
) -> EmbeddingPoint:
    cls = type(model).__name__
    blocks = blocks_of(model)
    inside = set() if blocks is None else {id(m) for m in blocks.modules()}
    names = {id(m): n for n, m in model.named_modules()}
    finished: list[tuple[nn.Module, Any]] = []
    started: list[tuple[nn.Module, Any]] = []
    hooks = []
    for mod in model.modules():
        hooks.append(mod.register_forward_hook(lambda m, i, o: finished.append((m, o))))
    if blocks is not None and len(blocks):
        hooks.append(
            blocks[0].register_forward_pre_hook(
                lambda m, a, k: started.append((m, a[0] if a else k.get("hidden_states"))),
                with_kwargs=True,
            )
        )
    iface = interface(model, tokenizer)
    ids = probe_ids(model, 4)
    try:
        with torch.no_grad():
            model(**iface.inputs(ids, torch.ones_like(ids)))
    finally:
        for h in hooks:
            h.remove()
    if not started:
        raise InterfaceError(
            f"{cls}: no list of blocks found whose first block runs, so saleval cannot find "
            "the input of its first block: use layer: word_embeddings"
        )
    first = started[0][1]
    producers = [m for m, o in finished if o is first and id(m) not in inside and m is not model]
    if producers:
        mod = producers[-1]  # the outermost: it finishes after the modules inside it
        return EmbeddingPoint(mod, f"{names.get(id(mod), '?')} (output)", "output")
    if isinstance(first, torch.Tensor):
        return EmbeddingPoint(started[0][0], "the first block's input", "input")
    raise InterfaceError(
        f"{cls}: cannot locate the input of its first block (no module outputs it); use "
        "layer: word_embeddings"
    )
