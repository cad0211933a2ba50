"""A prompted LLM as a classifier (docs/data-and-models.md#prompted-llms).

An instruction-tuned causal LM classifies by being *prompted*: the text goes into a
template (optionally after a few worked examples, inside the tokenizer's chat template),
and the class is read from the next-token distribution at the answer position over each
class's label words (Schick & Schütze 2021, "verbalizers"; Brown et al. 2020 for few-shot
prompting). Nothing is trained.

saleval explains such a model over the words of ``{text}`` alone. Two objects make the
rest of saleval treat it as any other classifier:

* :class:`PromptTokenizer` renders each text into its prompt and tokenizes the *whole*
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
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from saleval.config.model import ModelConfig, PromptConfig
from saleval.errors import UserError

log = logging.getLogger(__name__)

#: the file that makes a directory a prompted classifier (a train run's ``model/``)
PROMPT_FILE = "saleval_prompt.json"
PROMPT_FORMAT = "saleval-prompted/1"
#: stands for the text while the template is rendered (never in a text: a NUL byte)
_SENTINEL = "\x00saleval-text\x00"
CHAT_MODES = ("auto", "on", "off")


class PromptError(UserError, ValueError):
    """A prompt setting cannot be used; the message names the setting and the fix."""


# ---------------------------------------------------------------------------------------
# the prompt: rendering and tokenizing


@dataclass(frozen=True)
class Shot:
    """One worked example of a few-shot prompt, as drawn from the training split."""

    sample_id: str
    text: str
    label: int


def draw_shots(train: Any, n: int, seed: int, n_classes: int) -> list[Shot]:
    """``n`` examples of the training split ``train`` (a frame with sample_id, text, label),
    seeded and class-balanced, the classes taking turns (0, 1, 0, 1, ...) so that no class
    sits last before every query.

    >>> import pandas as pd
    >>> df = pd.DataFrame({"sample_id": list("abcdef"), "text": list("uvwxyz"),
    ...                    "label": [0, 0, 0, 1, 1, 1]})
    >>> [s.label for s in draw_shots(df, 4, seed=0, n_classes=2)]
    [0, 1, 0, 1]
    """
    if n <= 0:
        return []
    rng = np.random.default_rng(seed)
    labels = train["label"].to_numpy()
    queues = [list(rng.permutation(np.flatnonzero(labels == c))) for c in range(n_classes)]
    picked: list[int] = []
    while len(picked) < n and any(queues):
        for q in queues:
            if q and len(picked) < n:
                picked.append(int(q.pop(0)))
    if len(picked) < n:
        raise PromptError(
            f"model.prompt.shots={n}: the training split has only {len(picked)} examples"
        )
    rows = train.iloc[picked]
    return [
        Shot(str(s), str(t), int(y))
        for s, t, y in zip(rows["sample_id"], rows["text"], rows["label"], strict=True)
    ]


@dataclass(frozen=True)
class PromptSpec:
    """Everything that fixes a prompted classifier: written to :data:`PROMPT_FILE` so that
    every later stage rebuilds exactly the same prompt (and the run records it)."""

    lm: str  # the causal LM: a directory or a hub id
    labels: list[str]
    label_words: list[list[str]]  # per class, as appended to the prompt
    template: str
    instruction: str = ""
    system: str | None = None
    chat: bool = False
    add_special_tokens: bool = True
    shot_separator: str = "\n\n"
    shots: list[Shot] = field(default_factory=list)
    shot_seed: int = 0
    prefix_cache: bool = True
    pad_token: str | None = None  # set when the tokenizer had none (its eos token)

    def to_json(self) -> dict[str, Any]:
        return {"format": PROMPT_FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str) -> PromptSpec:
        if data.get("format") != PROMPT_FORMAT:
            raise PromptError(
                f"{where}: not a {PROMPT_FORMAT} file (format {data.get('format')!r})"
            )
        fields = {k: v for k, v in data.items() if k != "format"}
        fields["shots"] = [Shot(**s) for s in fields.get("shots", [])]
        try:
            return cls(**fields)
        except TypeError as err:
            raise PromptError(f"{where}: {err}") from err

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / PROMPT_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n")
        return path


def _messages(spec: PromptSpec, query: str) -> list[dict[str, str]]:
    """The chat of a prompt: the instruction opens the first user turn; each example is a
    user turn answered by its label word; the query is the last user turn."""
    out = [{"role": "system", "content": spec.system}] if spec.system else []
    head = spec.instruction + spec.shot_separator if spec.instruction else ""
    for shot in spec.shots:
        out.append({"role": "user", "content": head + spec.template.replace("{text}", shot.text)})
        out.append({"role": "assistant", "content": spec.label_words[shot.label][0].strip()})
        head = ""
    out.append({"role": "user", "content": head + spec.template.replace("{text}", query)})
    return out


def render_parts(spec: PromptSpec, tokenizer: Any) -> tuple[str, str]:
    """The prompt around the text: ``(before, after)``, so that a text's prompt is
    ``before + text + after``.

    Plain (``chat`` off): the instruction, each example as the template with its label
    word appended, and the template of the query, joined by ``shot_separator``. Chat: the
    tokenizer's chat template over :func:`_messages`, with the generation prompt.
    """
    if spec.template.count("{text}") != 1:
        raise PromptError(
            f"model.prompt.template must hold {{text}} exactly once: {spec.template!r}"
        )
    if spec.chat:
        rendered = tokenizer.apply_chat_template(
            _messages(spec, _SENTINEL), tokenize=False, add_generation_prompt=True
        )
    else:
        parts = [spec.instruction] if spec.instruction else []
        for shot in spec.shots:
            word = spec.label_words[shot.label][0]
            parts.append(spec.template.replace("{text}", shot.text) + word)
        parts.append(spec.template.replace("{text}", _SENTINEL))
        rendered = spec.shot_separator.join(parts)
    if str(rendered).count(_SENTINEL) != 1:
        raise PromptError("the chat template did not keep the text exactly once in the prompt")
    before, after = str(rendered).split(_SENTINEL)
    return before, after


@dataclass(frozen=True)
class PromptEncoding:
    """One text's prompt as the model reads it."""

    prompt: str  # the exact string the ids tokenize (the text cut where truncated)
    input_ids: list[int]
    offsets: list[tuple[int, int]]  # into the text; (0, 0) for template tokens
    special: list[int]  # 1: a template or special token, never a word's piece
    n_text_tokens: int
    full_length: int  # the prompt's length had the text not been cut


class PromptTokenizer:
    """A fast tokenizer that renders each text into its prompt first (see the module doc).

    Called as a Hugging Face tokenizer is (one text or a list; ``truncation``,
    ``max_length``, ``return_offsets_mapping``, ``return_special_tokens_mask``). With
    ``add_special_tokens=False`` a caller asks for the text's own pieces, and gets the
    base tokenizer's. ``max_length`` bounds the *text's* tokens; the template comes on
    top, and the whole prompt must fit the model's positions (``position_limit``).
    Everything else (ids of special tokens, ``decode``, ...) is the base tokenizer's.
    """

    def __init__(self, base: Any, spec: PromptSpec, position_limit: int | None = None) -> None:
        self.base = base
        self.spec = spec
        self.position_limit = position_limit
        self.before, self.after = render_parts(spec, base)
        self._memo: dict[tuple[str, int | None], PromptEncoding] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "base":
            raise AttributeError(name)
        return getattr(self.__dict__["base"], name)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_memo": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __len__(self) -> int:
        return len(self.base)

    @property
    def is_fast(self) -> bool:
        return True

    def render(self, text: str) -> str:
        """The prompt ``text`` is rendered into."""
        return self.before + text + self.after

    def encode_text(self, text: str, max_length: int | None = None) -> PromptEncoding:
        """``text``'s prompt tokenized whole, the text's tokens cut to ``max_length``."""
        key = (text, max_length)
        if key not in self._memo:
            self._memo[key] = self._encode(text, max_length)
        return self._memo[key]

    def _encode(self, text: str, max_length: int | None) -> PromptEncoding:
        prompt = self.render(text)
        a, b = len(self.before), len(self.before) + len(text)
        enc = self.base(
            prompt,
            add_special_tokens=self.spec.add_special_tokens,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
        )
        ids: list[int] = list(enc["input_ids"])
        in_text = [
            not sp and e > s and e > a and s < b
            for (s, e), sp in zip(enc["offset_mapping"], enc["special_tokens_mask"], strict=True)
        ]
        offsets = [
            (max(s, a) - a, min(e, b) - a) if t else (0, 0)
            for (s, e), t in zip(enc["offset_mapping"], in_text, strict=True)
        ]
        text_pos = [i for i, t in enumerate(in_text) if t]
        n_text, full = len(text_pos), len(ids)
        budget = n_text if max_length is None else min(n_text, int(max_length))
        if self.position_limit is not None:
            room = self.position_limit - (len(ids) - n_text)
            if room < 1:
                raise PromptError(
                    f"the prompt's template alone takes {len(ids) - n_text} tokens, and the "
                    f"model reads at most {self.position_limit}: use fewer model.prompt.shots "
                    "or a shorter template"
                )
            budget = min(budget, room)
        if budget < n_text:
            cut = set(text_pos[budget:])
            keep = [i for i in range(len(ids)) if i not in cut]
            end = offsets[text_pos[budget - 1]][1] if budget else 0
            prompt = self.render(text[:end])
            ids = [ids[i] for i in keep]
            offsets = [offsets[i] for i in keep]
            in_text = [in_text[i] for i in keep]
        return PromptEncoding(
            prompt=prompt,
            input_ids=ids,
            offsets=offsets,
            special=[0 if t else 1 for t in in_text],
            n_text_tokens=min(budget, n_text),
            full_length=full,
        )

    def __call__(
        self,
        text: str | Sequence[str],
        truncation: bool = False,
        max_length: int | None = None,
        return_offsets_mapping: bool = False,
        return_special_tokens_mask: bool = False,
        add_special_tokens: bool = True,
        **kwargs: Any,
    ) -> Any:
        from transformers import BatchEncoding

        if not add_special_tokens:  # the text's own pieces (e.g. to find a word's tokens)
            return self.base(
                text,
                truncation=truncation,
                max_length=max_length,
                return_offsets_mapping=return_offsets_mapping,
                return_special_tokens_mask=return_special_tokens_mask,
                add_special_tokens=False,
                **kwargs,
            )
        one = isinstance(text, str)
        texts = [cast(str, text)] if one else list(text)
        encs = [self.encode_text(t, max_length if truncation else None) for t in texts]
        out: dict[str, Any] = {
            "input_ids": [e.input_ids for e in encs],
            "attention_mask": [[1] * len(e.input_ids) for e in encs],
        }
        if return_offsets_mapping:
            out["offset_mapping"] = [e.offsets for e in encs]
        if return_special_tokens_mask:
            out["special_tokens_mask"] = [e.special for e in encs]
        if one:
            out = {k: v[0] for k, v in out.items()}
        return BatchEncoding(out)

    def prefix_ids(self) -> list[int]:
        """The template tokens before the text, as a text that starts with a letter gets
        them: what :class:`PromptedClassifier` caches."""
        enc = self.encode_text("Hello world")
        first = enc.special.index(0) if 0 in enc.special else len(enc.special)
        return enc.input_ids[:first]

    def save_pretrained(self, directory: str | Path) -> Any:
        return self.base.save_pretrained(directory)


def label_token_ids(
    tokenizer: PromptTokenizer, words: Sequence[Sequence[str]]
) -> list[list[list[int]]]:
    """Each label word's token ids as they follow the prompt: the tokens that tokenizing
    ``prompt + word`` adds to tokenizing ``prompt`` (a word's ids depend on what precedes
    it in byte-level and SentencePiece vocabularies). Where the prompt's own tokens change
    (the word merges with the prompt's last token) the word's own tokens are used, with a
    warning."""
    base = tokenizer.base
    probe = tokenizer.render("Hello world")
    special = tokenizer.spec.add_special_tokens
    head = list(base(probe, add_special_tokens=special)["input_ids"])
    out: list[list[list[int]]] = []
    for cls_words in words:
        ids_of: list[list[int]] = []
        for word in cls_words:
            full = list(base(probe + word, add_special_tokens=special)["input_ids"])
            if full[: len(head)] == head and len(full) > len(head):
                ids = full[len(head) :]
            else:
                ids = list(base(word, add_special_tokens=False)["input_ids"])
                log.warning(
                    "label word %r merges with the prompt's last token; scoring its own "
                    "tokens %s (end the template with a space or newline to avoid this)",
                    word, ids,
                )  # fmt: skip
            if not ids:
                raise PromptError(f"model.prompt.label_words: {word!r} has no tokens")
            ids_of.append([int(i) for i in ids])
        out.append(ids_of)
    return out


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
        embeddings (:func:`saleval.modeling.interface.embedding_point`)."""
        return self.embed

    def set_attn_implementation(self, impl: str) -> None:
        self.lm.set_attn_implementation(impl)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

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
    id takes the tokenizer's, as training does (:func:`saleval.modeling.interface.prepare_for_training`);
    returns the adopted pad token, or None when nothing changed."""
    from saleval.modeling.interface import prepare_for_training

    notes = prepare_for_training(lm, tok)
    return str(tok.pad_token) if notes else None


def spec_of(
    cfg: PromptConfig, lm: str, label_names: Sequence[str], train: Any, tokenizer: Any
) -> PromptSpec:
    """The :class:`PromptSpec` a ``model.prompt`` node means for this dataset."""
    mode = str(cfg.chat_template).lower()
    if mode not in CHAT_MODES:
        raise PromptError(f"model.prompt.chat_template must be one of {CHAT_MODES}, got {mode!r}")
    has_chat = bool(getattr(tokenizer, "chat_template", None))
    if mode == "on" and not has_chat:
        raise PromptError(
            f"model.prompt.chat_template=on, but the tokenizer of {lm} has no chat template: "
            "use chat_template=off (or auto)"
        )
    chat = has_chat if mode == "auto" else mode == "on"
    names = [str(n) for n in label_names]
    given = dict(cfg.label_words or {})
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise PromptError(
            f"model.prompt.label_words names {unknown}, not classes of the dataset {names}"
        )
    default = (lambda n: [n]) if chat else (lambda n: [" " + n])
    words = [[str(w) for w in given[n]] if n in given else default(n) for n in names]
    if any(not w for w in words):
        raise PromptError("model.prompt.label_words: every class needs at least one word")
    shots = draw_shots(train, int(cfg.shots), int(cfg.shot_seed), len(names)) if cfg.shots else []
    return PromptSpec(
        lm=str(Path(lm).expanduser().resolve()) if Path(lm).expanduser().is_dir() else lm,
        labels=names,
        label_words=words,
        template=str(cfg.template),
        instruction=str(cfg.instruction or ""),
        system=None if cfg.system is None else str(cfg.system),
        chat=chat,
        add_special_tokens=not chat,  # a chat template writes its own bos
        shot_separator=str(cfg.shot_separator),
        shots=shots,
        shot_seed=int(cfg.shot_seed),
        prefix_cache=bool(cfg.prefix_cache),
    )


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


def prompt_dir(source: str | Path) -> Path | None:
    """The directory holding :data:`PROMPT_FILE` for ``source`` (a prompt directory, or a
    train run whose ``model/`` is one); None when it is not a prompted classifier."""
    path = Path(source).expanduser()
    for where in (path, path / "model"):
        if (where / PROMPT_FILE).is_file():
            return where
    return None


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


def describe(spec: PromptSpec) -> dict[str, str]:
    """What a run records of a prompt (MLflow tags): the chat mode, the shots, the words."""
    return {
        "prompt.chat_template": str(spec.chat).lower(),
        "prompt.special_tokens": str(spec.add_special_tokens).lower(),
        "prompt.shots": str(len(spec.shots)),
        "prompt.shot_ids": ",".join(s.sample_id for s in spec.shots)[:5000],
        "prompt.label_words": json.dumps(dict(zip(spec.labels, spec.label_words, strict=True))),
        "prompt.prefix_cache": str(spec.prefix_cache).lower(),
    }
