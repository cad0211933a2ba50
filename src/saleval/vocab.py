"""One word per concept: the enumerations that configs and code share.

And one spelling for the columns whose names come from the data: a model's probability
of each class is the column ``prob_<label name>`` (:data:`PROBS`), built and read only
through that declaration, from the explain stage's writer to every reader.

Each concept that appears in more than one config group or module is spelt once here
(and the answer "I don't know", which the ``crowd`` schema and the crowd code share).
They are :class:`enum.StrEnum` rather than ``typing.Literal`` because OmegaConf's
structured configs validate enum fields when a config is composed (a misspelt value
fails naming the allowed ones) and do not support ``Literal``; a ``StrEnum`` member
compares equal to its string, so code may keep comparing with plain strings.

>>> Target("prediction") == "prediction"
True
>>> str(Population.misclassified)
'misclassified'
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

IDK = "I don't know"
"""The answer option for "I cannot tell from the shown words" (docs/study-design.md#display)."""

IDK_ALIASES: tuple[str, ...] = (IDK, "I do not know", "don't know", "idk", "unknown", "?")
"""Raw answers read as "I don't know" (compared case-, space- and apostrophe-insensitively,
so "dont know" and "I DON’T KNOW" match too); the default of ``crowd.idk``."""


class Target(StrEnum):
    """Which class an explanation (and a crowd task) is about.

    ``gold``: the true label (workers recognise it from the shown words);
    ``prediction``: the model's predicted class (forward prediction).
    """

    gold = "gold"
    prediction = "prediction"


class Population(StrEnum):
    """Which samples a study or an explain run draws from, by the model's outcome."""

    all = "all"
    correct = "correct"
    misclassified = "misclassified"


class Removal(StrEnum):
    """How a removed word's tokens are perturbed, always on token ids (saleval.words.perturb_ids).

    ``delete``: the tokens are dropped; ``mask``: each becomes ``[MASK]``; ``unk``: each
    becomes ``[UNK]``. LIME, occlusion and the faithfulness metrics share this word.
    """

    delete = "delete"
    mask = "mask"
    unk = "unk"


class Ties(StrEnum):
    """How :func:`saleval.words.rank_words` orders words with equal scores.

    ``text_order``: the earlier word first (deterministic, and the same for the crowd's
    top-k and the metrics' top-k). ``against``: words in the given set (a planted
    shortcut) go after the others they tie with, so a tie earns a method no credit.
    """

    text_order = "text_order"
    against = "against"


@dataclass(frozen=True)
class ColumnFamily:
    """Columns named ``<prefix><name>``, one per name the data brings (a class label), all
    of ``dtype``. :class:`saleval.pipeline.tables.TableSpec` checks a family's columns,
    and every stage builds and parses their names here, so none spells the prefix itself.

    >>> PROBS.columns(["neg", "pos"])
    ['prob_neg', 'prob_pos']
    >>> PROBS.names(["sample_id", "prob_neg", "pred", "prob_pos"])
    ['neg', 'pos']
    >>> PROBS.pattern
    'prob_<label name>'
    """

    prefix: str
    dtype: str
    stands_for: str  # what follows the prefix, as messages and docs name it

    @property
    def pattern(self) -> str:
        """How messages name the family: ``prob_<label name>``."""
        return f"{self.prefix}<{self.stands_for}>"

    def column(self, name: str) -> str:
        """The column of ``name``."""
        return f"{self.prefix}{name}"

    def columns(self, names: Iterable[str]) -> list[str]:
        """The columns of ``names``, in their order."""
        return [self.column(n) for n in names]

    def holds(self, column: str) -> bool:
        """Whether ``column`` belongs to the family."""
        return column.startswith(self.prefix)

    def of(self, columns: Iterable[str]) -> list[str]:
        """The family's columns among ``columns``, in their order."""
        return [c for c in columns if self.holds(c)]

    def names(self, columns: Iterable[str]) -> list[str]:
        """The names behind the family's columns among ``columns``, in their order."""
        return [c.removeprefix(self.prefix) for c in self.of(columns)]


PROBS = ColumnFamily("prob_", "float64", "label name")
"""The model's probability of each class, ``prob_<label name>`` in class-index order
(``tables.PREDICTIONS``)."""
