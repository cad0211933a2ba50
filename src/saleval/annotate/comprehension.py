"""The comprehension check a participant passes before the first task
(docs/annotate.md#comprehension).

Prolific's rules for researchers ask that a comprehension check test what the
instructions say (not the participant's knowledge) and allow two attempts; a participant
who fails them all is screened out, never rejected. The default questions are built from
what every saleval task set's instructions say (:func:`saleval.crowd.export.formats.instructions`):
what a dot stands for, what to answer when the words shown do not tell, and what is
being asked (the text's category, or the model's guess in a forward-prediction study).
A study may give its own questions in a YAML file instead.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from saleval.errors import UserError
from saleval.vocab import IDK, Target


class ComprehensionError(UserError, ValueError):
    """The configured questions cannot be asked (file, row and field named)."""


@dataclass(frozen=True)
class Question:
    """One multiple-choice question; ``answer`` is the right option's text."""

    prompt: str
    options: tuple[str, ...]
    answer: str


def default_questions(target: str, run_key: str) -> list[Question]:
    """Three questions on the instructions, options in an order fixed per task set.

    >>> qs = default_questions("gold", "run-1")
    >>> [q.answer for q in qs][:2]
    ['A hidden word', "I don't know"]
    >>> qs == default_questions("gold", "run-1")  # every participant sees the same page
    True
    """
    asked = (
        ("The category the text belongs to", "The category an AI model chose for the text")
        if target != Target.prediction
        else ("The category an AI model chose for the text", "The category the text belongs to")
    )
    questions = [
        Question(
            "In a task's text, what does a dot (.) stand for?",
            ("A hidden word", "The end of a sentence", "A word the AI model found important"),
            "A hidden word",
        ),
        Question(
            "What do you answer when the words shown do not tell you the category?",
            (IDK, "The category that seems most common", "Any category, as a guess"),
            IDK,
        ),
        Question(
            "Which do you choose in each task?",
            (*asked, "Whether the text is well written"),
            asked[0],
        ),
    ]
    return [_shuffled(q, run_key) for q in questions]


def _shuffled(q: Question, run_key: str) -> Question:
    """The options in an order drawn from the task set and question: the right answer is
    not always first, and a reload never reorders them."""
    seed = int(hashlib.sha256(f"{run_key}\0{q.prompt}".encode()).hexdigest()[:12], 16)
    options = list(q.options)
    random.Random(seed).shuffle(options)
    return Question(q.prompt, tuple(options), q.answer)


def read_questions(path: str | Path) -> list[Question]:
    """A study's own questions: a YAML list of ``{question, options, answer}``."""
    path = Path(path).expanduser()
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ComprehensionError(
            f"annotate.comprehension.questions_file={path}: cannot be read ({err.strerror})"
        ) from None
    except yaml.YAMLError as err:
        raise ComprehensionError(f"{path}: not valid YAML ({err})") from None
    if not isinstance(raw, list) or not raw:
        raise ComprehensionError(
            f"{path}: expected a non-empty list of {{question, options, answer}} entries"
        )
    return [_question(path, i, item) for i, item in enumerate(raw, start=1)]


def _question(path: Path, row: int, item: object) -> Question:
    if not isinstance(item, Mapping):
        raise ComprehensionError(f"{path}: entry {row}: expected question, options and answer")
    for key in ("question", "options", "answer"):
        if key not in item:
            raise ComprehensionError(f"{path}: entry {row}, field {key!r}: missing")
    options = item["options"]
    if not isinstance(options, Sequence) or isinstance(options, str) or len(options) < 2:
        raise ComprehensionError(f"{path}: entry {row}, field 'options': give 2 or more options")
    opts = tuple(str(o) for o in options)
    if len(set(opts)) != len(opts):
        raise ComprehensionError(f"{path}: entry {row}, field 'options': an option is repeated")
    if str(item["answer"]) not in opts:
        raise ComprehensionError(
            f"{path}: entry {row}, field 'answer': {item['answer']!r} is not one of {list(opts)}"
        )
    return Question(str(item["question"]), opts, str(item["answer"]))


def grade(questions: Sequence[Question], given: Mapping[int, str]) -> list[int]:
    """The indices of the questions answered wrong (unanswered ones included).

    >>> q = [Question("a?", ("x", "y"), "x"), Question("b?", ("x", "y"), "y")]
    >>> grade(q, {0: "x", 1: "x"}), grade(q, {0: "x", 1: "y"}), grade(q, {})
    ([1], [], [0, 1])
    """
    return [i for i, q in enumerate(questions) if given.get(i) != q.answer]
