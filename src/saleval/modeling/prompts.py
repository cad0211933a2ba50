"""The prompt of a prompted LLM (docs/data-and-models.md#prompted-llms): what fixes it,
how a text is rendered into it, and how its tokens split into the text's and the
template's.

:class:`PromptTokenizer` renders each text into its prompt and tokenizes the *whole*
prompt, so the ids are exactly what tokenizing the recorded prompt gives; every token
outside ``{text}`` (instruction, few-shot examples, chat tokens, the answer cue) is
marked special with an empty offset — as ``[CLS]``/``[SEP]`` are for BERT — so no method,
metric or crowd view ever scores, removes or shows it. :class:`PromptSpec` is everything
that fixes a prompt, written with a run so that every later stage rebuilds it exactly.
The classifier that reads the label words is :mod:`saleval.modeling.prompted`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from saleval.config.model import PromptConfig
from saleval.errors import UserError, warn_once

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


def messages(spec: PromptSpec, query: str) -> list[dict[str, str]]:
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
    tokenizer's chat template over :func:`messages`, with the generation prompt.
    """
    if spec.template.count("{text}") != 1:
        raise PromptError(
            f"model.prompt.template must hold {{text}} exactly once: {spec.template!r}"
        )
    if spec.chat:
        rendered = tokenizer.apply_chat_template(
            messages(spec, _SENTINEL), tokenize=False, add_generation_prompt=True
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
                warn_once(  # once per word: every stage loading the model meets it
                    log,
                    "label word %r merges with the prompt's last token; scoring its own "
                    "tokens %s (end the template with a space or newline to avoid this)",
                    word, ids,
                )  # fmt: skip
            if not ids:
                raise PromptError(f"model.prompt.label_words: {word!r} has no tokens")
            ids_of.append([int(i) for i in ids])
        out.append(ids_of)
    return out


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


def prompt_dir(source: str | Path) -> Path | None:
    """The directory holding :data:`PROMPT_FILE` for ``source`` (a prompt directory, or a
    train run whose ``model/`` is one); None when it is not a prompted classifier."""
    path = Path(source).expanduser()
    for where in (path, path / "model"):
        if (where / PROMPT_FILE).is_file():
            return where
    return None


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
