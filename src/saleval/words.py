"""From tokens to words (docs/methods.md#words) — the one place where words are defined.

A *word* is a whitespace-delimited chunk of the original text with punctuation
stripped from its edges (``"(AP)"`` → ``AP``, ``"pension,"`` → ``pension``);
inner punctuation stays (``state-of-the-art``, ``don't``, ``3.5``, URLs).
Chunks made only of punctuation/symbols (``--``, ``...``, ``!!!``) are not
words, and HTML line breaks (``<br />``) count as whitespace.

Sub-word pieces belong to the word whose characters they cover, read from the
fast tokenizer's offset mapping (never by string surgery on ``##`` pieces, which
breaks on accents and lower-casing). Pieces that cover no word (special tokens,
edge punctuation) map to -1 and never reach a ranking. A word any of whose
pieces was cut by truncation is dropped whole: it is neither shown nor ranked.

Every method produces token scores; :func:`token_to_word_scores` turns them into
word scores the same way for all of them, so comparisons stay fair.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from saleval.errors import UserError

if TYPE_CHECKING:  # only a type here: the CLI imports this without loading transformers
    from transformers import PreTrainedTokenizerFast

_CHUNK = re.compile(r"\S+")
_MARKUP_BREAK = re.compile(r"<br\s*/?>", re.IGNORECASE)


def _is_punct(ch: str) -> bool:
    return unicodedata.category(ch).startswith("P")


def _is_word_char(ch: str) -> bool:
    cat = unicodedata.category(ch)
    return cat[0] in ("L", "N") or cat in ("Sc",)  # letters, digits, currency ($10)


def word_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the words of ``text`` (see the module docstring)."""
    masked = _MARKUP_BREAK.sub(lambda m: " " * len(m.group(0)), text)
    spans = []
    for m in _CHUNK.finditer(masked):
        s, e = m.start(), m.end()
        while s < e and _is_punct(masked[s]):
            s += 1
        while e > s and _is_punct(masked[e - 1]):
            e -= 1
        if s < e and any(_is_word_char(c) for c in masked[s:e]):
            spans.append((s, e))
    return spans


@dataclass(frozen=True)
class Segmentation:
    """A text's kept words and how its (truncated) token ids map onto them."""

    text: str
    input_ids: list[int]
    token_word: list[int]  # per token: index into ``words`` or -1
    special: list[bool]  # per token: [CLS], [SEP], ...
    words: list[str]
    spans: list[tuple[int, int]]
    truncated: bool

    @property
    def n_words(self) -> int:
        return len(self.words)

    @property
    def n_tokens(self) -> int:
        return len(self.input_ids)

    def word_token_index(self) -> list[list[int]]:
        """Token positions of every word."""
        out: list[list[int]] = [[] for _ in self.words]
        for t, w in enumerate(self.token_word):
            if w >= 0:
                out[w].append(t)
        return out


def _encode(text: str, tokenizer: PreTrainedTokenizerFast, max_length: int) -> tuple[Any, int]:
    """The truncated encoding with offsets and special-token mask, and the untruncated
    length (so a segmentation knows whether the text was cut)."""
    enc = tokenizer(
        text,
        truncation=True,
        max_length=max_length,
        return_offsets_mapping=True,
        return_special_tokens_mask=True,
    )
    return enc, len(tokenizer(text, truncation=False, add_special_tokens=True)["input_ids"])


def segment(text: str, tokenizer: PreTrainedTokenizerFast, max_length: int) -> Segmentation:
    """Tokenize ``text`` (with truncation) and map its tokens onto its words."""
    enc, full_len = _encode(text, tokenizer, max_length)
    ids: list[int] = enc["input_ids"]
    offsets: list[tuple[int, int]] = enc["offset_mapping"]
    special: list[int] = enc["special_tokens_mask"]
    spans = word_spans(text)
    starts = np.array([s for s, _ in spans], dtype=np.int64)

    raw_word = [-1] * len(ids)
    for t, ((s, e), sp) in enumerate(zip(offsets, special)):
        if sp or e <= s:
            continue
        # the word overlapping the piece (a piece may start on stripped edge punctuation,
        # e.g. an added token '#0' whose word is '0')
        w = int(np.searchsorted(starts, e - 1, side="right")) - 1
        if w >= 0 and s < spans[w][1]:
            raw_word[t] = w
    # A word survives only if the tokenizer produced all of its characters' pieces,
    # i.e. its last character is covered by a kept token.
    last_cover: dict[int, int] = {}
    for t, w in enumerate(raw_word):
        if w >= 0:
            last_cover[w] = max(last_cover.get(w, -1), offsets[t][1])
    truncated = full_len > len(ids)
    kept = [w for w in range(len(spans)) if last_cover.get(w, -1) >= spans[w][1]]
    new_index = {w: i for i, w in enumerate(kept)}
    token_word = [new_index.get(w, -1) if w >= 0 else -1 for w in raw_word]
    kept_spans = [spans[w] for w in kept]
    return Segmentation(
        text=text,
        input_ids=ids,
        token_word=token_word,
        special=[bool(x) for x in special],
        words=[text[s:e] for s, e in kept_spans],
        spans=kept_spans,
        truncated=truncated,
    )


def piece_segment(text: str, tokenizer: PreTrainedTokenizerFast, max_length: int) -> Segmentation:
    """``text`` segmented so that every non-special word piece is a unit of its own.

    The piece unit of Bastings et al. (2022), who rank word pieces: every saliency method
    then scores (and LIME and occlusion perturb) single pieces, punctuation pieces
    included; ``[CLS]``/``[SEP]`` are never ranked. ``words`` holds the pieces' strings.
    """
    enc, full_len = _encode(text, tokenizer, max_length)
    ids: list[int] = enc["input_ids"]
    special = [bool(x) for x in enc["special_tokens_mask"]]
    pieces = [t for t, sp in enumerate(special) if not sp]
    token_word = [-1] * len(ids)
    for i, t in enumerate(pieces):
        token_word[t] = i
    offsets = [tuple(enc["offset_mapping"][t]) for t in pieces]
    words = tokenizer.convert_ids_to_tokens([ids[t] for t in pieces])
    assert isinstance(words, list)  # a list of ids gives a list of tokens
    return Segmentation(
        text=text,
        input_ids=ids,
        token_word=token_word,
        special=special,
        words=words,
        spans=[(int(a), int(b)) for a, b in offsets],
        truncated=full_len > len(ids),
    )


REDUCERS = ("sum", "max", "mean", "first")


def token_to_word_scores(
    token_scores: Sequence[float] | np.ndarray, seg: Segmentation, reduce: str = "sum"
) -> np.ndarray:
    """Word scores from token scores: sum (default), max or mean over a word's pieces.

    ``first`` takes the word's first piece only (what the original crowd study displayed).
    """
    if reduce not in REDUCERS:
        raise ValueError(f"word reduction must be one of {REDUCERS}, got {reduce!r}")
    scores = np.asarray(token_scores, dtype=np.float64)
    if scores.shape[0] < seg.n_tokens:
        raise ValueError(f"{scores.shape[0]} token scores for {seg.n_tokens} tokens")
    tw = np.asarray(seg.token_word)
    mask = tw >= 0
    idx, vals = tw[mask], scores[: seg.n_tokens][mask]
    if reduce == "first":
        out = np.zeros(seg.n_words)
        first = np.unique(idx, return_index=True)
        out[first[0]] = vals[first[1]]
        return out
    if reduce == "max":
        out = np.full(seg.n_words, -np.inf)
        np.maximum.at(out, idx, vals)
        return out
    out = np.zeros(seg.n_words)
    np.add.at(out, idx, vals)
    if reduce == "mean":
        counts = np.bincount(idx, minlength=seg.n_words)
        out = out / np.maximum(counts, 1)
    return out


class RemovalError(UserError, ValueError):
    """A removal the tokenizer cannot perform (``mask`` without a mask token, ...)."""


def removal_token(mode: str, tokenizer: PreTrainedTokenizerFast | None) -> int | None:
    """The id a removed word's tokens become under ``mode`` (None for ``delete``).

    Never a silent substitute: a tokenizer without the token (GPT-2 and Llama have no
    ``[MASK]``) is an error naming the alternatives, not a quiet ``delete``.

    >>> removal_token("delete", None) is None
    True
    """
    if mode == "delete":
        return None
    if mode not in ("mask", "unk"):
        raise RemovalError(f"removal must be delete, mask or unk; got {mode!r}")
    if tokenizer is None:
        raise ValueError(f"removal {mode} needs the tokenizer")
    token = tokenizer.mask_token_id if mode == "mask" else tokenizer.unk_token_id
    if token is None:
        other = "unk" if mode == "mask" and tokenizer.unk_token_id is not None else None
        options = "delete" + (f" or {other}" if other else "")
        raise RemovalError(
            f"removal: {mode} needs a {mode} token, and the tokenizer "
            f"({type(tokenizer).__name__}) has none: use removal: {options}"
        )
    return int(token)


def perturb_ids(
    seg: Segmentation,
    keep: Sequence[bool] | np.ndarray,
    mode: str = "delete",
    tokenizer: PreTrainedTokenizerFast | None = None,
    keep_other: bool = True,
) -> list[int]:
    """Token ids with the words where ``keep`` is False removed — always on ids.

    ``mode``: ``delete`` drops the word's tokens (the sequence gets shorter), ``mask``
    / ``unk`` replace each of them with ``[MASK]`` / ``[UNK]`` (length kept).
    Tokens that belong to no word (special tokens, punctuation) stay when
    ``keep_other``; special tokens always stay.
    """
    keep = np.asarray(keep, dtype=bool)
    if keep.shape[0] != seg.n_words:
        raise ValueError(f"keep has {keep.shape[0]} entries for {seg.n_words} words")
    replacement = removal_token(mode, tokenizer)
    out: list[int] = []
    for tok, w, sp in zip(seg.input_ids, seg.token_word, seg.special):
        if w >= 0:
            if keep[w]:
                out.append(tok)
            elif replacement is not None:
                out.append(replacement)
        elif sp or keep_other:
            out.append(tok)
        elif replacement is not None:
            out.append(replacement)
    return out


def rank_words(
    scores: Sequence[float] | np.ndarray,
    ties: str = "text_order",
    against: Sequence[int] = (),
) -> np.ndarray:
    """Positions of the words from most to least salient: the one word ranking.

    Every top-k in saleval (the crowd's shown words, the metrics' removed words, the
    views' highlights, the shortcut protocol's precision) comes from this function, so
    they agree by construction. ``ties`` (:class:`saleval.vocab.Ties`) decides equal
    scores: ``text_order`` puts the earlier word first; ``against`` puts the positions
    in ``against`` after the words they tie with (then text order).

    >>> rank_words([0.1, 0.5, 0.5, 0.2]).tolist()
    [1, 2, 3, 0]
    >>> rank_words([0.1, 0.5, 0.5, 0.2], ties="against", against=[1]).tolist()
    [2, 1, 3, 0]
    """
    from saleval.vocab import Ties

    rule = Ties(ties)
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1:
        raise ValueError(f"scores must be one score per word, got shape {s.shape}")
    bad = np.flatnonzero(~np.isfinite(s))
    if len(bad):
        raise ValueError(f"word scores are not finite at positions {bad[:5].tolist()}")
    flagged = np.zeros(len(s), dtype=bool)
    if rule is Ties.against:
        flagged[np.asarray(list(against), dtype=np.int64)] = True
    elif len(against):
        raise ValueError("against= is only used with ties='against'")
    # lexsort: the last key is the primary one
    return np.lexsort((np.arange(len(s)), flagged, -s))
