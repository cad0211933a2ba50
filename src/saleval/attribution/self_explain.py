"""Self-explanation (docs/methods.md#self-explanation): the prompted LLM names the words.

After the classification prompt and the model's answer (the label word of the explained
class), a second prompt asks it which words of the text decided that answer; its greedy
reply is parsed into a ranking of the text's words. Self-explanations of LLMs are
studied by Huang et al. (2023, "Can large language models explain themselves?") and
Madsen et al. (2024, "Are self-explanations from LLMs faithful?"); saleval scores them
with the same crowd and metrics as every other method.

Parsing never invents a word: a named item that is not a word of the text is reported
(``unknown``), and a reply that names no word of the text gives every word a score of 0
(text order ranks them) and is recorded as such for that text (:data:`ANSWERS`).
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from saleval.attribution.base import AttributionError, Attributor, Texts, register
from saleval.modeling.devices import model_device

log = logging.getLogger(__name__)

#: the follow-up question (``{max_words}`` is filled in): docs/methods.md#self-explanation
QUESTION = (
    "Which words of the text decided this answer? Reply with up to {max_words} words "
    "copied from the text, most important first, separated by commas."
)
#: what the plain (no chat template) follow-up ends with: the reply starts after it
PLAIN_CUE = "\nWords:"

_SPLIT = re.compile(r"[,;\n]|\band\b|\s+-\s+")
_ITEM_MARK = re.compile(r"^\s*(?:[-*•]+|\(?\d+[.)]|[a-z][.)])\s+", re.IGNORECASE)


def _norm(word: str) -> str:
    """A word as the parser compares it: NFKC, case-folded, edge punctuation and quotes off."""
    w = unicodedata.normalize("NFKC", word).casefold().strip()
    while w and unicodedata.category(w[0])[0] not in "LN":
        w = w[1:]
    while w and unicodedata.category(w[-1])[0] not in "LN":
        w = w[:-1]
    return w


@dataclass(frozen=True)
class ParsedAnswer:
    """A reply read against the text's words."""

    answer: str
    named: list[str]  # the text's words the reply names, in its order (each once)
    unknown: list[str]  # items of the reply that are no word of the text
    scores: np.ndarray = field(repr=False)  # per word of the text: higher = named earlier

    @property
    def no_word(self) -> bool:
        return not self.named


def parse_answer(answer: str, words: Sequence[str]) -> ParsedAnswer:
    """Read a reply as a ranking of ``words`` (the text's words, in text order).

    Items are split at commas, semicolons, newlines and "and"; list marks (``1.``, ``-``)
    and quotes are dropped; an item of several words names each of them. Matching is on
    case-folded words; every occurrence of a named word gets its score, the first named
    scoring highest (``n`` for ``n`` named words, down to 1); unnamed words score 0.

    >>> p = parse_answer("1. Wonderful\\n2. \\"boring\\", plot twist", ["a", "wonderful", "but", "boring", "plot"])
    >>> p.named, p.unknown, p.scores.tolist()
    (['wonderful', 'boring', 'plot'], ['twist'], [0.0, 3.0, 0.0, 2.0, 1.0])
    >>> parse_answer("I cannot tell.", ["great", "film"]).no_word
    True
    """
    index: dict[str, list[int]] = {}
    for i, w in enumerate(words):
        index.setdefault(_norm(w), []).append(i)
    named: list[str] = []
    unknown: list[str] = []
    for item in _SPLIT.split(answer):
        item = _ITEM_MARK.sub("", item)
        for piece in item.split():
            key = _norm(piece)
            if not key:
                continue
            if key in index:
                if key not in named:
                    named.append(key)
            elif key not in unknown:
                unknown.append(key)
    scores = np.zeros(len(words))
    for rank, key in enumerate(named):
        scores[index[key]] = float(len(named) - rank)
    return ParsedAnswer(answer, named, unknown, scores)


#: text -> the last parsed reply for it, for the explain stage's ``self_explanations.csv``
ANSWERS: dict[tuple[str, int], ParsedAnswer] = {}


@register("self_explain", display="Self-explanation")
class SelfExplain(Attributor):
    """The prompted LLM's own answer to "which words decided it?" (see the module doc).

    ``max_words`` (asked for) and ``max_new_tokens`` (generated, greedy) bound the reply.
    Needs ``model=prompted``: a model without a prompt has no one to ask.
    """

    def __init__(self, *, max_words: int = 5, max_new_tokens: int = 48, **kw: Any) -> None:
        super().__init__(**kw)
        if int(max_words) < 1 or int(max_new_tokens) < 1:
            raise AttributionError("self_explain: max_words and max_new_tokens must be >= 1")
        self.max_words = int(max_words)
        self.max_new_tokens = int(max_new_tokens)

    def prepare(self, model: Any, tokenizer: Any) -> None:
        from saleval.modeling.prompted import PromptedClassifier
        from saleval.modeling.prompts import PromptTokenizer

        if not isinstance(model, PromptedClassifier) or not isinstance(tokenizer, PromptTokenizer):
            raise AttributionError(
                f"self_explain asks the model which words decided its answer: it needs a "
                f"prompted LLM (model=prompted), not a {type(model).__name__}"
            )

    def follow_up(self, tokenizer: Any, text: str, target: int) -> str:
        """The self-explanation prompt for ``text`` answered as class ``target``."""
        from saleval.modeling.prompts import messages

        spec = tokenizer.spec
        answer = spec.label_words[target][0]
        question = QUESTION.format(max_words=self.max_words)
        if spec.chat:
            chat = messages(spec, spec.template.replace("{text}", text))
            chat += [
                {"role": "assistant", "content": answer.strip()},
                {"role": "user", "content": question},
            ]
            return str(
                tokenizer.base.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            )
        return tokenizer.render(text) + answer + spec.shot_separator + question + PLAIN_CUE

    def word_scores(self, texts: Texts) -> list[np.ndarray]:
        import torch

        model, tok = texts.model, texts.tokenizer
        spec = tok.spec
        device = model_device(model)
        out = []
        for seg, target in zip(texts.segs, texts.targets, strict=True):
            prompt = self.follow_up(tok, seg.text, int(target))
            enc = tok.base(prompt, add_special_tokens=spec.add_special_tokens, return_tensors="pt")
            ids = enc["input_ids"].to(device)
            with torch.no_grad():
                gen = cast(Any, model).lm.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=self.max_new_tokens,
                    do_sample=False,
                    pad_token_id=tok.pad_token_id,
                )
            reply = tok.base.decode(gen[0, ids.shape[1] :], skip_special_tokens=True)
            parsed = parse_answer(reply, seg.words)
            ANSWERS[(seg.text, int(target))] = parsed
            if parsed.no_word:
                log.info("self_explain: the reply %r names no word of the text", reply[:80])
            self._note("named_words", [len(parsed.named)])
            self._note("unknown_words", [len(parsed.unknown)])
            self._note("no_word", [float(parsed.no_word)])
            out.append(parsed.scores)
        return out
