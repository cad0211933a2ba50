"""The answer vocabulary of a crowd task (docs/study-design.md#display) and the one parser of
raw answers.

A worker answers a label name or "I don't know". Answers are coded as in docs/aggregation.md:
0 = "I don't know", c + 1 = label c (0-based). Everything that shows, writes or reads
an answer (the exports, the simulated crowd, the annotation app, the importer, the
``crowd.idk`` default of ``conf/crowd/answers.yaml``) takes these words from here.

>>> answer_options(["neg", "pos"])
['neg', 'pos', "I don't know"]
>>> parse = AnswerParser(["neg", "pos"])
>>> [parse(a) for a in ["POS", "0", "I Don’t  know", "?"]]
[2, 1, 0, 0]
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from saleval.crowd.errors import CrowdImportError
from saleval.vocab import IDK, IDK_ALIASES  # spelt in saleval.vocab, which the schemas share

IDK_CODE = 0
"""Answer code of "I don't know" (docs/aggregation.md: L = 0); label c (0-based) is coded c + 1."""

_APOSTROPHES = str.maketrans({"\u2019": "", "\u2018": "", "`": "", "'": "", "\u00b4": ""})
_INT = re.compile(r"^[+-]?\d+(\.0*)?$")


def answer_options(label_names: Sequence[str]) -> list[str]:
    """What a worker can answer: every label name, then "I don't know"."""
    return [*label_names, IDK]


def normalise(text: str) -> str:
    """Case-, space- and apostrophe-insensitive key ("I Don’t  know" == "idontknow")."""
    return "".join(str(text).lower().translate(_APOSTROPHES).split())


class AnswerParser:
    """Maps a raw answer to its code: 0 = "I don't know", c + 1 = label c.

    Label names win over indices, so a dataset whose label names are digits still
    parses as names; indices are 0-based positions in ``label_names``. "I don't know"
    itself is always understood, whatever ``idk`` lists.
    """

    def __init__(self, label_names: Sequence[str], idk: Iterable[str] = IDK_ALIASES) -> None:
        self.label_names = [str(n) for n in label_names]
        self.names = {normalise(n): i + 1 for i, n in enumerate(self.label_names)}
        if len(self.names) != len(self.label_names):
            raise CrowdImportError(f"label names collide once normalised: {self.label_names}")
        self.idk = {normalise(s) for s in idk} | {normalise(IDK)}
        clash = self.idk & set(self.names)
        if clash:
            raise CrowdImportError(f"'I don't know' aliases {sorted(clash)} are also label names")

    def __call__(self, raw: str) -> int:
        key = normalise(raw)
        if key in self.names:
            return self.names[key]
        if key in self.idk:
            return IDK_CODE
        if _INT.match(key):
            idx = int(float(key))
            if 0 <= idx < len(self.label_names):
                return idx + 1
            raise ValueError(f"label index {idx} out of range 0..{len(self.label_names) - 1}")
        raise ValueError(
            f"unknown label {raw!r}; expected one of {self.label_names}, an index "
            f'0..{len(self.label_names) - 1} or "I don\'t know"'
        )
