"""A prompted LLM as a classifier (docs/data-and-models.md#prompted-llms).

An instruction-tuned causal LM classifies by being *prompted*: the text goes into a
template (optionally after a few worked examples, inside the tokenizer's chat template),
and the class is read from the next-token distribution at the answer position over each
class's label words (Schick & Schütze 2021, "verbalizers"; Brown et al. 2020 for few-shot
prompting). Nothing is trained.

saleval explains such a model over the words of ``{text}`` alone. Two objects make the
rest of saleval treat it as any other classifier:

* :class:`PromptTokenizer` (:mod:`saleval.modeling.prompts`) renders each text into its prompt and tokenizes the *whole*
  prompt (so the ids are exactly what tokenizing the recorded prompt gives), then marks
  every template token (instruction, examples, chat tokens, the answer cue) as a special
  token with an empty offset — as ``[CLS]``/``[SEP]`` are for BERT. Every method, metric
  and crowd view already keeps special tokens fixed: they are never scored, never removed
  or replaced, never shown, and the IG/DeepLIFT baselines keep them (docs/methods.md).
* :class:`PromptedClassifier` takes those ids and returns, as its ``logits``, each class's
  label-word log-probability at the last real token (the answer position). A label word
  of several tokens scores the sum of its tokens' log-probabilities (each given the ones
  before it); a class with several label words scores the log of their summed
  probabilities (``logsumexp``).

The template tokens before ``{text}`` (instruction, few-shot examples) are the same for
every text: their keys and values are computed once (:meth:`PromptedClassifier.prefix_cache`)
and reused by every batch — the perturbations of LIME, occlusion and the metrics included.
Reusing them changes no logit beyond float noise (tests/test_prompted.py;
docs/benchmarks.md#prefix-cache).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from saleval.config.model import ModelConfig
from saleval.modeling.devices import model_device
from saleval.modeling.prompts import (
    PROMPT_FILE,
    PromptError,
    PromptSpec,
    PromptTokenizer,
    label_token_ids,
    prompt_dir,
    spec_of,
)

# ---------------------------------------------------------------------------------------
# the classifier


class _TextEmbedding(nn.Module):
    """The token embeddings of the prompt's ids: the tensor the gradient methods attribute
    to (docs/methods.md#embeddings). A module of its own so that a hook on it replaces the
    prompt's embeddings only, never those of a label word's continuation."""

    def __init__(self, table: nn.Module) -> None:
        super().__init__()
        self.table = table

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.table(input_ids))


@dataclass
class PromptedOutput:
    """What a classifier's forward returns, as transformers' outputs name it."""

    logits: torch.Tensor
    attentions: tuple[torch.Tensor, ...] | None = None


class PromptedClassifier(nn.Module):
    """A causal LM read as a classifier over label words (see the module doc).

    ``forward(input_ids, attention_mask)`` takes right-padded prompts (from
    :class:`PromptTokenizer`) and returns ``logits`` of shape ``(batch, classes)``: each
    class's label-word log-probability at the row's last real token.
    """

    def __init__(
        self,
        lm: Any,
        label_names: Sequence[str],
        label_ids: Sequence[Sequence[Sequence[int]]],
        prefix_ids: Sequence[int] = (),
        prefix_cache: bool = True,
    ) -> None:
        super().__init__()
        self.lm = lm
        self.config = lm.config
        self.config.id2label = dict(enumerate(str(n) for n in label_names))
        self.config.label2id = {str(n): i for i, n in enumerate(label_names)}
        self.embed = _TextEmbedding(lm.get_input_embeddings())
        self.label_ids = [[list(w) for w in c] for c in label_ids]
        self.prefix_ids = [int(i) for i in prefix_ids]
        self.use_prefix_cache = bool(prefix_cache)
        self._cache: (
            tuple[torch.device, torch.dtype, list[tuple[torch.Tensor, torch.Tensor]]] | None
        )
        self._cache = None
        #: forward passes that could use the cached prefix, and that could not
        self.cache_hits = self.cache_misses = 0

    # what saleval asks of a classifier
    def get_input_embeddings(self) -> nn.Module:
        return cast(nn.Module, self.lm.get_input_embeddings())

    def explained_embeddings(self) -> nn.Module:
        """The module whose output the gradient methods attribute to: the prompt's token
        embeddings (:func:`saleval.modeling.embedding.embedding_point`)."""
        return self.embed

    def set_attn_implementation(self, impl: str) -> None:
        self.lm.set_attn_implementation(impl)

    @property
    def device(self) -> torch.device:
        return model_device(self)

    # the shared prefix
    def prefix_cache(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Keys and values of :attr:`prefix_ids` for every layer, computed once per device
        and dtype."""
        table = cast(torch.Tensor, self.get_input_embeddings().weight)
        key = (table.device, table.dtype)
        if self._cache is None or self._cache[:2] != key:
            ids = torch.as_tensor([self.prefix_ids], dtype=torch.long, device=table.device)
            with torch.no_grad():
                out = self.lm(input_ids=ids, use_cache=True)
            layers = [(lay.keys.detach(), lay.values.detach()) for lay in _cache_of(out).layers]
            self._cache = (table.device, table.dtype, layers)
        return self._cache[2]

    def _usable_prefix(self, input_ids: torch.Tensor, lengths: torch.Tensor) -> int:
        """How many leading tokens every row shares with the cached prefix (each row keeps
        at least one token to compute)."""
        n = min(len(self.prefix_ids), input_ids.shape[1])
        if not self.use_prefix_cache or n == 0:
            return 0
        prefix = torch.as_tensor(self.prefix_ids[:n], device=input_ids.device)
        same = (input_ids[:, :n] == prefix).long().cumprod(1).sum(1)
        return int(torch.minimum(same, lengths - 1).min().clamp_min(0))

    def _cache_for(self, p: int, batch: int) -> Any:
        from transformers import DynamicCache

        data = [
            (k[:, :, :p].expand(batch, -1, -1, -1), v[:, :, :p].expand(batch, -1, -1, -1))
            for k, v in self.prefix_cache()
        ]
        return DynamicCache(ddp_cache_data=data)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        use_prefix_cache: bool | None = None,
    ) -> PromptedOutput:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        emb = self.embed(input_ids)
        batch, width = input_ids.shape
        lengths = attention_mask.long().sum(1)
        p = 0
        if use_prefix_cache is not False and not output_attentions:
            p = self._usable_prefix(input_ids, lengths)
        if self.use_prefix_cache and use_prefix_cache is not False:
            if p:
                self.cache_hits += 1
            else:
                self.cache_misses += 1
        positions = torch.arange(width, device=input_ids.device).expand(batch, width)
        answer = lengths - 1 - p  # in the computed (uncached) positions
        keep = torch.unique(answer)
        multi = any(len(w) > 1 for c in self.label_ids for w in c)
        kwargs: dict[str, Any] = {}
        if output_attentions:
            kwargs["output_attentions"] = True
        out = self.lm(
            inputs_embeds=emb[:, p:],
            attention_mask=attention_mask,
            position_ids=positions[:, p:],
            **{_cache_arg(self.lm): self._cache_for(p, batch) if p else None},
            use_cache=multi,
            logits_to_keep=keep,
            **kwargs,
        )
        rows = torch.arange(batch, device=input_ids.device)
        first = torch.log_softmax(
            out.logits[rows, torch.searchsorted(keep, answer)].float(), dim=-1
        )
        scores = []
        for words in self.label_ids:
            per_word = [
                first[:, w[0]] + self._continuation(w, out, attention_mask, lengths, width)
                for w in words
            ]
            scores.append(torch.logsumexp(torch.stack(per_word, 1), dim=1))
        attentions = getattr(out, "attentions", None) if output_attentions else None
        return PromptedOutput(torch.stack(scores, 1), attentions)

    def _continuation(
        self, word: list[int], out: Any, mask: torch.Tensor, lengths: torch.Tensor, width: int
    ) -> torch.Tensor | float:
        """Log-probability of a label word's tokens after its first, each given the ones
        before it: the word's tokens follow each row's last real token (the padding
        between is masked out), on the prompt's cached keys and values."""
        if len(word) == 1:
            return 0.0
        batch = mask.shape[0]
        cont = torch.as_tensor(word[:-1], dtype=torch.long, device=mask.device)
        table = self.get_input_embeddings()
        emb = table(cont)[None].expand(batch, -1, -1)
        steps = torch.arange(len(word) - 1, device=mask.device)
        cache = _cache_of(out)
        res = self.lm(
            inputs_embeds=emb,
            attention_mask=torch.cat([mask, torch.ones_like(mask[:, : len(word) - 1])], 1),
            position_ids=lengths[:, None] + steps[None],
            use_cache=True,
            **{_cache_arg(self.lm): cache},
        )
        cache.crop(-(len(word) - 1))  # back to the prompt's keys and values
        logp = torch.log_softmax(res.logits.float(), dim=-1)
        nxt = torch.as_tensor(word[1:], device=mask.device)
        return logp[:, steps, nxt].sum(1)


def _cache_arg(lm: nn.Module) -> str:
    """The name a causal LM's forward takes its key/value cache by (``cache`` in
    transformers 5.2x, ``past_key_values`` before)."""
    from saleval.modeling.interface import forward_params

    return "cache" if "cache" in forward_params(lm) else "past_key_values"


def _cache_of(out: Any) -> Any:
    got = getattr(out, "cache", None)
    return got if got is not None else out.past_key_values


# ---------------------------------------------------------------------------------------
# building and loading


def _load_lm(where: str, attn_implementation: str | None) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(where).expanduser()
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    try:
        lm = AutoModelForCausalLM.from_pretrained(str(path) if path.is_dir() else where, **kwargs)
        tok = AutoTokenizer.from_pretrained(str(path) if path.is_dir() else where, use_fast=True)
    except (OSError, ValueError) as err:
        raise PromptError(
            f"{where}: cannot load a causal LM and its tokenizer ({str(err).splitlines()[0]}); "
            "model=prompted needs a directory (or, with a network, a hub id) of an "
            "AutoModelForCausalLM checkpoint"
        ) from err
    if not getattr(tok, "is_fast", False):
        raise PromptError(f"{where}: its tokenizer is not a fast tokenizer; word offsets need one")
    lm.eval()
    return lm, tok


def adopt_pad_token(lm: Any, tok: Any) -> str | None:
    """A tokenizer without a pad token pads with its eos token, and a config without a pad
    id takes the tokenizer's, as training does (:func:`saleval.modeling.padding.prepare_for_training`);
    returns the adopted pad token, or None when nothing changed."""
    from saleval.modeling.padding import prepare_for_training

    notes = prepare_for_training(lm, tok)
    return str(tok.pad_token) if notes else None


def from_spec(
    spec: PromptSpec, attn_implementation: str | None = "eager", lm_and_tok: Any = None
) -> tuple[Any, Any]:
    """The classifier and tokenizer a :class:`PromptSpec` fixes (the LM loaded from
    ``spec.lm`` unless given): a :class:`PromptedClassifier` and a :class:`PromptTokenizer`,
    typed ``Any`` because every stage takes them where it takes a transformers model and
    fast tokenizer (they answer what saleval asks of those)."""
    from saleval.modeling.interface import position_limit

    lm, tok = lm_and_tok or _load_lm(spec.lm, attn_implementation)
    adopt_pad_token(lm, tok)
    ptok = PromptTokenizer(tok, spec, position_limit(lm, tok))
    ids = label_token_ids(ptok, spec.label_words)
    model = PromptedClassifier(lm, spec.labels, ids, ptok.prefix_ids(), spec.prefix_cache)
    model.eval()
    return model, ptok


def build(
    cfg: ModelConfig | Mapping[str, Any] | Any,
    lm: str,
    label_names: Sequence[str],
    train: Any = None,
    attn_implementation: str | None = "eager",
) -> tuple[Any, Any, PromptSpec]:
    """A prompted classifier from a ``model=prompted`` node, on the causal LM at ``lm``;
    ``train`` (the training split) gives the few-shot examples."""
    from omegaconf.errors import OmegaConfBaseException

    from saleval.schema import to_schema

    try:
        mc = to_schema(ModelConfig, cfg)
    except OmegaConfBaseException as err:
        raise PromptError(f"model config: {str(err).splitlines()[0]}") from err
    if mc.prompt is None:
        raise PromptError("model.prompt is not set: use model=prompted")
    if mc.prompt.shots and train is None:
        raise PromptError("model.prompt.shots needs the dataset's training split")
    loaded = _load_lm(lm, attn_implementation)
    pad = getattr(loaded[1], "pad_token", None)
    spec = spec_of(mc.prompt, lm, label_names, train, loaded[1])
    model, tok = from_spec(spec, attn_implementation, loaded)
    if pad is None:
        spec = PromptSpec(**{**asdict(spec), "shots": spec.shots, "pad_token": tok.pad_token})
    return model, tok, spec


def load(source: str | Path, attn_implementation: str | None = "eager") -> tuple[Any, Any]:
    """A prompted classifier from its directory (:func:`prompt_dir`)."""
    where = prompt_dir(source)
    if where is None:
        raise PromptError(f"{source}: no {PROMPT_FILE}: not a prompted classifier")
    path = where / PROMPT_FILE
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise PromptError(
            f"{path}: not valid JSON ({err}); write it again with saleval-train"
        ) from err
    return from_spec(PromptSpec.from_json(data, str(path)), attn_implementation)
