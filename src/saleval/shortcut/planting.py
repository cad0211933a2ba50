"""Where planted tokens go and where they landed (docs/shortcut.md).

Tokens are inserted as whitespace-separated words, multi-token shortcuts at most
``max_distance`` tokens apart (:func:`plant_tokens`). Every example keeps where its
tokens landed: ``gt_tokens`` (positions in the model's input ids, ``[CLS]`` = 0) and
``gt_words`` (indices into the kept words of :func:`saleval.words.segment`, the unit
every saliency ranking uses), both read back from the real tokenisation of the final
text, never predicted (:func:`locate`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerFast

from saleval.shortcut.rules import ShortcutError, vocab_ids
from saleval.words import segment

_CHUNK = re.compile(r"\S+")


@dataclass
class Planted:
    """One text with tokens planted, and where they ended up."""

    text: str
    inserted: list[str]  # the planted tokens, in text order
    gt_tokens: list[int]  # their positions in the input ids ([CLS] = 0)
    gt_words: list[int]  # their kept-word indices
    distance: int | None = None  # token distance between first and last planted token
    extra: dict[str, Any] = field(default_factory=dict)


def _boundaries(
    text: str, tokenizer: PreTrainedTokenizerFast, max_length: int, n_insert: int
) -> tuple[list[tuple[int, int]], np.ndarray, int]:
    """Whitespace chunks, tokens before each chunk boundary, and how many boundaries
    leave room for ``n_insert`` tokens inside the truncation window."""
    chunks = [(m.start(), m.end()) for m in _CHUNK.finditer(text)]
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    starts = np.array([s for s, _ in enc["offset_mapping"]], dtype=np.int64)
    cuts = [s for s, _ in chunks] + [len(text) + 1]
    before = np.searchsorted(starts, np.array(cuts), side="left")
    room = max_length - tokenizer.num_special_tokens_to_add() - n_insert
    allowed = int(np.searchsorted(before, room, side="right"))
    return chunks, before, allowed


def _insert(text: str, chunks: list[tuple[int, int]], placed: list[tuple[int, str]]) -> str:
    """``text`` with each (boundary, token) inserted as its own word; boundary b < len(chunks)
    means before chunk b, b == len(chunks) the end. Equal boundaries keep list order."""
    if not chunks:
        return " ".join(t for _, t in placed)
    out = text
    for b in sorted({b for b, _ in placed}, reverse=True):
        toks = [t for bb, t in placed if bb == b]
        if b < len(chunks):
            at = chunks[b][0]
            out = out[:at] + " ".join(toks) + " " + out[at:]
        else:
            at = chunks[-1][1]
            out = out[:at] + " " + " ".join(toks) + out[at:]
    return out


def plant_tokens(
    text: str,
    tokens: Sequence[str],
    tokenizer: PreTrainedTokenizerFast,
    rng: np.random.Generator,
    max_length: int,
    max_distance: int,
    token_ids: Mapping[str, int] | None = None,
) -> Planted:
    """Insert ``tokens`` (kept in this order) at random word boundaries of ``text``.

    Positions are uniform over the boundaries that stay inside the truncation window;
    the last token lands at most ``max_distance`` tokens after the first. The result's
    ground truth is read back from the real tokenisation and checked.
    """
    n = len(tokens)
    chunks, before, allowed = _boundaries(text, tokenizer, max_length, n)
    if allowed == 0:
        raise ShortcutError(
            f"no room for {n} token(s) within max_length={max_length}: {text[:80]!r}"
        )
    if n > 2:
        raise ShortcutError(f"at most two planted tokens per text, got {list(tokens)}")
    first = int(rng.integers(allowed))
    bounds = [first]
    if n == 2:
        # once both are in, the two tokens sit |before[b] - before[first]| + 1 apart
        gap = np.abs(before[:allowed] - before[first]) + 1
        other = int(rng.choice(np.flatnonzero(gap <= max_distance)))
        bounds = sorted([first, other])
    placed = list(zip(bounds, tokens))
    planted = locate(_insert(text, chunks, placed), tokens, tokenizer, max_length, token_ids)
    if planted.distance is not None and planted.distance > max_distance:
        raise ShortcutError(
            f"planted tokens {planted.distance} > {max_distance} apart: {planted.text[:120]!r}"
        )
    return planted


def locate(
    text: str,
    tokens: Sequence[str],
    tokenizer: PreTrainedTokenizerFast,
    max_length: int,
    token_ids: Mapping[str, int] | None = None,
) -> Planted:
    """Find planted ``tokens`` (expected in this order) in the tokenised ``text``."""
    ids = dict(token_ids or zip(tokens, vocab_ids(tokenizer, list(tokens))))
    wanted = {ids[t]: t for t in tokens}
    seg = segment(text, tokenizer, max_length)
    pos = [i for i, tid in enumerate(seg.input_ids) if tid in wanted]
    found = [wanted[seg.input_ids[i]] for i in pos]
    words = [seg.token_word[i] for i in pos]
    if found != list(tokens) or any(w < 0 for w in words):
        raise ShortcutError(
            f"planted {list(tokens)} but the tokenised text holds {found} "
            f"(words {words}): {text[:120]!r}"
        )
    distance = pos[-1] - pos[0] if len(pos) > 1 else None
    return Planted(text, list(tokens), pos, words, distance)
