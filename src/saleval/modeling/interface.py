"""One forward for every model family (docs/data-and-models.md#families).

A classifier of any family — BERT, RoBERTa, DeBERTa, DistilBERT, ELECTRA, ModernBERT, or
a decoder such as GPT-2, Llama or Qwen with a classification head — is fed and read
through this module, so that every method explains exactly the input the model classifies:

* **its inputs** (:class:`ModelInterface`): the tensors its tokenizer produces
  (``tokenizer.model_input_names``) and its ``forward`` takes — never a ``token_type_ids``
  the tokenizer does not make (GPT-2 *adds* an embedding for every token type it is given);
* **its padding**: batches are right-padded with the id the model itself treats as
  padding (``config.pad_token_id``: a decoder's head finds its last non-pad token by it,
  RoBERTa numbers positions by it), so a padded batch gives each text the logits it gets
  alone (:func:`check_padding` verifies this on the model at hand);
* **the position it reads** (:func:`classifier_reads`): found through the model, by which
  positions of the last hidden state the logits depend on — the first token (BERT's
  ``[CLS]``), the last non-pad token (decoders) or every token (mean pooling);
* **"the embeddings"** (:func:`saleval.modeling.embedding.embedding_point`): the input to
  the first block, built by the model's own modules (word + position + token type where
  the model adds them), or the word embeddings alone (``get_input_embeddings()``);
* **its position limit** (:func:`position_limit`), which caps ``max_length``.
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from saleval.config.model import DEFAULT_MAX_LENGTH
from saleval.errors import UserError
from saleval.modeling.devices import model_device

#: the positions a classifier's logits read: the first token, the last non-pad token, all
Reads = Literal["first", "last", "mean"]
#: what the gradient methods attribute to (docs/methods.md#embeddings)
EMBEDDING_LAYERS = ("embeddings", "word_embeddings")


class InterfaceError(UserError, ValueError):
    """A model cannot be fed or read as saleval needs; the message names the class and the fix."""


@dataclass(frozen=True)
class ModelInterface:
    """How one model is fed: the input tensors it takes and the id it pads with.

    >>> iface = ModelInterface("BertForSequenceClassification",
    ...     ("input_ids", "token_type_ids", "attention_mask"), pad_token_id=0)
    >>> sorted(iface.inputs(torch.tensor([[5, 6]]), torch.tensor([[1, 1]])))
    ['attention_mask', 'input_ids', 'token_type_ids']
    """

    model_class: str
    input_names: tuple[str, ...]
    pad_token_id: int

    def inputs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """The keyword arguments of the model's forward for right-padded ``input_ids``.

        ``token_type_ids`` (all zeros: one segment, as the tokenizer makes for one text)
        only where the tokenizer produces them.
        """
        out = {"input_ids": input_ids, "attention_mask": attention_mask}
        if "token_type_ids" in self.input_names:
            out["token_type_ids"] = torch.zeros_like(input_ids)
        return out

    def pad(
        self, sequences: Sequence[Sequence[int]], device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``sequences`` right-padded with :attr:`pad_token_id`: ``(input_ids, attention_mask)``."""
        width = max((len(s) for s in sequences), default=0)
        ids = torch.full((len(sequences), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, seq in enumerate(sequences):
            ids[row, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
            mask[row, : len(seq)] = 1
        if device is not None:
            ids, mask = ids.to(device), mask.to(device)
        return ids, mask


def forward_params(model: nn.Module) -> set[str]:
    """The named parameters of ``model.forward`` (not a ``**kwargs`` catch-all)."""
    params = inspect.signature(model.forward).parameters.values()
    return {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def pad_token_id(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast | None) -> int:
    """The id every padded batch is padded with: the model's own ``config.pad_token_id``
    (what a decoder head and RoBERTa's positions read), else the tokenizer's, else 0
    (an encoder masks padding out, so any id serves there)."""
    own = getattr(model.config, "pad_token_id", None)
    if isinstance(own, int):
        return own
    tok = None if tokenizer is None else tokenizer.pad_token_id
    return int(tok) if tok is not None else 0


def interface(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast | None) -> ModelInterface:
    """The :class:`ModelInterface` of ``model`` with ``tokenizer``.

    Inputs are those the tokenizer produces that the model's forward names; without a
    tokenizer, ids and mask only (every family's defaults then apply).
    """
    names: tuple[str, ...] = ("input_ids", "attention_mask")
    if tokenizer is not None:
        produced = tuple(getattr(tokenizer, "model_input_names", names))
        takes = forward_params(model)
        names = tuple(n for n in produced if n in takes) or names
        for need in ("input_ids", "attention_mask"):
            if need not in names:
                names = (*names, need)
    return ModelInterface(type(model).__name__, names, pad_token_id(model, tokenizer))


def basic_interface(tokenizer: PreTrainedTokenizerFast) -> ModelInterface:
    """The inputs ``tokenizer`` produces, padded with its pad id (or 0): how a model is fed
    where only its tokenizer is at hand. With the model, use :func:`interface`."""
    names = tuple(getattr(tokenizer, "model_input_names", ("input_ids", "attention_mask")))
    pad = tokenizer.pad_token_id
    return ModelInterface("?", names, int(pad) if pad is not None else 0)


# ---------------------------------------------------------------------------------------
# the position the classifier reads


_READS: weakref.WeakKeyDictionary[nn.Module, Reads] = weakref.WeakKeyDictionary()


def probe_ids(model: PreTrainedModel, n: int) -> torch.Tensor:
    """``n`` ordinary token ids of ``model``'s vocabulary (none a special or pad id)."""
    special = {
        getattr(model.config, k, None)
        for k in ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id")
    }
    table = model.get_input_embeddings()
    vocab = int(cast(torch.Tensor, table.weight).shape[0])
    ids = [i for i in range(vocab // 2, vocab) if i not in special][:n]
    return torch.as_tensor(ids, dtype=torch.long, device=model_device(model)).unsqueeze(0)


def classifier_reads(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast | None = None
) -> Reads:
    """Which positions of the last hidden state ``model``'s logits depend on.

    Found through the model, not from its class: one text at a time (no padding), the
    gradient of the logits with respect to the last block's output is non-zero exactly at
    the positions the head reads (what follows the blocks — a final norm, the head — works
    per position or reads positions, never mixes them). The first token → ``first`` (BERT-style ``[CLS]``
    pooling), the last → ``last`` (decoders: the last non-pad token), every token →
    ``mean`` (mean pooling). Anything else is an :class:`InterfaceError`. Remembered per
    model.
    """
    if model in _READS:
        return _READS[model]
    iface = interface(model, tokenizer)
    blocks = blocks_of(model)
    if blocks is None or not len(blocks):
        raise InterfaceError(
            f"{type(model).__name__}: no list of {getattr(model.config, 'num_hidden_layers', '?')} "
            "blocks found, so saleval cannot tell which position its classifier reads"
        )
    seen = []
    was_training = model.training
    model.eval()
    try:
        for n in (3, 6):
            ids = probe_ids(model, n)
            with torch.enable_grad(), _captured_output(blocks[-1]) as last:
                out = model(**iface.inputs(ids, torch.ones_like(ids)))
                if not last or not last[0].requires_grad:
                    raise InterfaceError(
                        f"{type(model).__name__}: its last block's output carries no gradient, "
                        "so saleval cannot tell which position its classifier reads"
                    )
                last[0].retain_grad()
                out.logits.sum().backward()
            grad = last[0].grad
            model.zero_grad(set_to_none=True)
            if grad is None:
                raise InterfaceError(
                    f"{type(model).__name__}: its logits do not depend on its last block's "
                    "output, so saleval cannot tell which position it reads"
                )
            used = (grad[0].abs().sum(-1) > 0).tolist()
            if used == [True] + [False] * (n - 1):
                seen.append("first")
            elif used == [False] * (n - 1) + [True]:
                seen.append("last")
            elif all(used):
                seen.append("mean")
            else:
                seen.append(f"positions {[i for i, u in enumerate(used) if u]} of {n}")
    finally:
        model.train(was_training)
    if seen[0] != seen[1] or seen[0] not in ("first", "last", "mean"):
        raise InterfaceError(
            f"{type(model).__name__}: its logits read {seen[0]} (and {seen[1]} of a longer "
            "text): neither the first token, the last one, nor all of them; saleval cannot "
            "say which position the classifier reads"
        )
    reads: Reads = seen[0]  # type: ignore[assignment]
    _READS[model] = reads
    return reads


@contextlib.contextmanager
def _captured_output(module: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Inside, the list holds ``module``'s output (its first element when a tuple) once it
    has run. A hook of saleval's own, removed after: transformers' ``output_hidden_states``
    would install hooks for good that no process can pickle (``ddp_spawn``)."""
    got: list[torch.Tensor] = []

    def hook(m: nn.Module, i: Any, o: Any) -> None:
        got.append(o[0] if isinstance(o, tuple | list) else o)

    handle = module.register_forward_hook(hook)
    try:
        yield got
    finally:
        handle.remove()


def is_decoder(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast | None = None) -> bool:
    """Whether ``model`` classifies from its last non-pad token (a decoder classifier)."""
    return classifier_reads(model, tokenizer) == "last"


def read_weights(reads: Reads, attention_mask: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` weights over the positions the classifier reads, each row summing to 1,
    for a right-padded batch.

    >>> m = torch.tensor([[1, 1, 1], [1, 1, 0]])
    >>> read_weights("last", m).tolist()
    [[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]
    >>> read_weights("mean", m)[1].tolist()
    [0.5, 0.5, 0.0]
    """
    mask = attention_mask.float()
    if reads == "first":
        out = torch.zeros_like(mask)
        out[:, 0] = 1.0
        return out
    if reads == "last":
        out = torch.zeros_like(mask)
        last = attention_mask.long().sum(1).clamp_min(1) - 1
        out[torch.arange(len(out), device=out.device), last] = 1.0
        return out
    return mask / mask.sum(1, keepdim=True).clamp_min(1.0)


# ---------------------------------------------------------------------------------------
# padded batches give the logits of each text alone

_CHECKED: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


def check_padding(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast | None,
    sequences: Sequence[Sequence[int]],
    atol: float = 1e-4,
) -> None:
    """Fail unless a right-padded batch gives each text the logits the model gives it alone.

    Why: every method explains the logits of a padded batch. A decoder head that cannot
    find its last non-pad token, or a model that lets padding in, would be explained at
    another input than the one it classifies — silently. Checked once per model on the
    shortest and longest of ``sequences``.
    """
    if model in _CHECKED or len(sequences) < 1:
        return
    iface = interface(model, tokenizer)
    by_len = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    pick = [list(sequences[by_len[0]]), list(sequences[by_len[-1]])]
    if len(pick[0]) == len(pick[1]):  # make one row padded
        pick[0] = pick[0][: max(1, len(pick[0]) - 2)]
    device = model_device(model)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            alone = [
                model(**iface.inputs(*iface.pad([seq], device))).logits.float()[0] for seq in pick
            ]
            try:
                batch = model(**iface.inputs(*iface.pad(pick, device))).logits.float()
            except ValueError as err:  # transformers: a decoder head without a pad id
                if "padding token" not in str(err):
                    raise
                raise InterfaceError(
                    f"{iface.model_class} classifies from its last non-pad token, but its "
                    "config names no pad_token_id, so it cannot find that token in a padded "
                    "batch: set model.config.pad_token_id (e.g. to the tokenizer's pad or eos "
                    "token id) and save the checkpoint again"
                ) from err
    finally:
        model.train(was_training)
    expected = torch.stack(alone)
    gap = float((batch - expected).abs().max())
    if gap > atol * float(expected.abs().max().clamp_min(1.0)):
        raise InterfaceError(
            f"{iface.model_class}: a right-padded batch changes its logits by {gap:.3g} (padded "
            f"with id {iface.pad_token_id}): saleval would explain another input than the one "
            "it classifies; check the checkpoint's config.pad_token_id against its tokenizer"
        )
    _CHECKED[model] = True


def blocks_of(model: nn.Module) -> nn.ModuleList | None:
    """The model's list of transformer blocks: the first ModuleList of
    ``num_hidden_layers`` modules."""
    n = getattr(model.config, "num_hidden_layers", None)
    for mod in model.modules():
        if isinstance(mod, nn.ModuleList) and len(mod) == n:
            return mod
    return None


# ---------------------------------------------------------------------------------------
# the token limit


def position_limit(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast | None = None
) -> int | None:
    """The longest input ``model`` can take: its position table (less RoBERTa's offset of
    ``padding_idx + 1``) or its tokenizer's ``model_max_length``, whichever is smaller;
    None when neither says.

    >>> from transformers import BertConfig, BertForSequenceClassification
    >>> position_limit(BertForSequenceClassification(BertConfig(hidden_size=8,
    ...     num_hidden_layers=1, num_attention_heads=1, intermediate_size=8,
    ...     max_position_embeddings=40)))
    40
    """
    limits = []
    n = getattr(model.config, "max_position_embeddings", None)
    if isinstance(n, int) and n > 0:
        emb = getattr(getattr(model, "base_model", model), "embeddings", None)
        offset = getattr(emb, "padding_idx", None)
        has_table = isinstance(getattr(emb, "position_embeddings", None), nn.Embedding)
        limits.append(n - (offset + 1) if isinstance(offset, int) and has_table else n)
    t = getattr(tokenizer, "model_max_length", None)
    if isinstance(t, int) and 0 < t < 1_000_000:
        limits.append(t)
    return min(limits) if limits else None


def effective_max_length(
    configured: int | None,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast | None = None,
    default: int = DEFAULT_MAX_LENGTH,
) -> int:
    """The token limit texts are cut to: ``configured`` (else ``default``), capped by the
    model's :func:`position_limit`.

    >>> from transformers import BertConfig, BertForSequenceClassification
    >>> m = BertForSequenceClassification(BertConfig(hidden_size=8, num_hidden_layers=1,
    ...     num_attention_heads=1, intermediate_size=8, max_position_embeddings=40))
    >>> effective_max_length(None, m), effective_max_length(16, m)
    (40, 16)
    """
    want = int(configured) if configured else int(default)
    limit = position_limit(model, tokenizer)
    return want if limit is None else min(want, limit)


def model_tags(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast | None) -> dict[str, str]:
    """What a run records of how it fed and read its model (MLflow tags): the model class,
    its inputs, its pad id, the pad token it adopted from its tokenizer (if any), and the
    positions its classifier reads."""
    iface = interface(model, tokenizer)
    tags = {
        "model.class": iface.model_class,
        "model.inputs": ",".join(iface.input_names),
        "model.pad_token_id": str(iface.pad_token_id),
        "model.reads": classifier_reads(model, tokenizer),
    }
    from saleval.modeling.padding import ADOPTED_PAD

    if model in ADOPTED_PAD:
        tags["model.pad_adopted"] = ADOPTED_PAD[model]
    return tags


def check_replacement(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast | None, token_id: int, what: str
) -> None:
    """Refuse a replacement token that a decoder head would take for padding.

    GPT-2's one special token is its eos, unk and (as fine-tuned) pad token at once: words
    replaced by it would make the head skip them when it looks for its last non-pad token,
    so the "removed" text would be read at another position. ``what`` names the setting.
    """
    pad = interface(model, tokenizer).pad_token_id
    if int(token_id) == pad and is_decoder(model, tokenizer):
        raise InterfaceError(
            f"{what}: its token (id {token_id}) is also {type(model).__name__}'s pad token, "
            "and a decoder head skips padding when it looks for its last token: use "
            "removal: delete"
        )
