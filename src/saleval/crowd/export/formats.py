"""What goes to workers and platforms (docs/study-design.md#exports): a registry of export
formats, each written into every task run by :func:`write_exports`.

The built-in formats:

* ``bundles_long`` (``bundles_long.csv``): the generic long export, one row per
  (bundle, position) with the task id, the display text and the answer options.
* ``bundles_wide`` (``bundles_wide.csv``): one row per bundle, one column group per
  position (``task_001_id``, ``task_001_text``, ...), the shape batch-upload tools of crowd
  platforms (e.g. MTurk's ``${task_001_text}`` template variables) expect.
* ``instructions`` (``instructions.md``): the instructions for one dataset: label
  descriptions with an example each, the "I don't know" option, and "judge only from the
  shown words".

A new format is one function registered with :func:`register_export`, as methods and
metrics are registered (docs/extending.md#an-export-format). No export may carry labels
or gold flags: platforms show uploaded columns in the page source, and a worker who
could read the answer would void the study.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from saleval.crowd.answers import answer_options
from saleval.crowd.design import render
from saleval.vocab import IDK, PROBS, Target
from saleval.words import word_spans

WIDE_FILE = "bundles_wide.csv"
LONG_FILE = "bundles_long.csv"
INSTRUCTIONS_FILE = "instructions.md"
OPTION_SEP = "|"


def bundles_long(
    tasks: pd.DataFrame, bundles: pd.DataFrame, label_names: Sequence[str]
) -> pd.DataFrame:
    """The generic long export: bundle, position, task id, display text, options."""
    merged = bundles.merge(
        tasks[["task_id", "display_text"]], on="task_id", how="left", validate="many_to_one"
    )
    missing = merged["display_text"].isna()
    if missing.any():
        row = merged[missing].iloc[0]
        raise ValueError(
            f"bundles: task {row['task_id']!r} (bundle {row['bundle_id']}) is not in tasks"
        )
    merged = merged.sort_values(["bundle_id", "position"], kind="stable")
    return pd.DataFrame(
        {
            "bundle_id": merged["bundle_id"].to_numpy(),
            "position": merged["position"].to_numpy(),
            "task_id": merged["task_id"].to_numpy(),
            "display_text": merged["display_text"].to_numpy(),
            "options": OPTION_SEP.join(answer_options(label_names)),
        }
    )


def bundles_wide(
    tasks: pd.DataFrame, bundles: pd.DataFrame, label_names: Sequence[str]
) -> pd.DataFrame:
    """One row per bundle; for position p the columns ``task_<p>_id`` and ``task_<p>_text``.

    Bundles shorter than the longest leave their trailing groups empty.
    """
    long = bundles_long(tasks, bundles, label_names)
    n_max = int(long["position"].max())
    width = max(3, len(str(n_max)))
    rows = []
    for bid, g in long.groupby("bundle_id", sort=True):
        row: dict[str, Any] = {
            "bundle_id": bid,
            "n_tasks": len(g),
            "options": OPTION_SEP.join(answer_options(label_names)),
        }
        for p, tid, text in zip(g["position"], g["task_id"], g["display_text"]):
            row[f"task_{int(p):0{width}d}_id"] = tid
            row[f"task_{int(p):0{width}d}_text"] = text
        rows.append(row)
    cols = ["bundle_id", "n_tasks", "options"]
    for p in range(1, n_max + 1):
        cols += [f"task_{p:0{width}d}_id", f"task_{p:0{width}d}_text"]
    return pd.DataFrame(rows).reindex(columns=cols)


def pick_examples(
    predictions: pd.DataFrame,
    exclude: set[str],
    label_names: Sequence[str],
    max_words: int = 40,
) -> dict[str, str | None]:
    """One example text per (gold) label for the instructions, from explained samples
    that are neither study nor gold items (a worker must not meet a study text in
    the instructions). Preference: the model got it right, 5 to ``max_words`` words,
    high confidence; a longer text is cut after ``max_words`` words."""
    pool = predictions[~predictions["sample_id"].isin(exclude)].copy()
    pool["n_words"] = [len(word_spans(str(t))) for t in pool["text"]]
    pool = pool[pool["n_words"] > 0]
    prob_cols = PROBS.columns(label_names)
    if len(pool) and all(c in pool.columns for c in prob_cols):
        probs = pool[prob_cols].to_numpy()
        pool["confidence"] = probs[np.arange(len(pool)), pool["label"].to_numpy(dtype=int)]
    else:
        pool["confidence"] = 1.0
    pool["wrong"] = pool["label"] != pool["pred"]
    pool["too_long"] = ~pool["n_words"].between(5, max_words)
    pool = pool.sort_values(
        ["wrong", "too_long", "confidence", "n_words", "sample_id"],
        ascending=[True, True, False, True, True],
    )
    out: dict[str, str | None] = {}
    for i, name in enumerate(label_names):
        hit = pool[pool["label"] == i]
        if not len(hit):
            out[name] = None
            continue
        text = " ".join(str(hit["text"].iloc[0]).split())
        if hit["n_words"].iloc[0] > max_words:
            text = text[: word_spans(text)[max_words - 1][1]] + " …"
        out[name] = text
    return out


def _demo(text: str) -> str:
    """The example rendered with every third word shown, to show the dots."""
    words = [text[s:e] for s, e in word_spans(text)]
    return render(words, [i for i in range(len(words)) if i % 3 == 1])


def instructions(
    dataset_name: str,
    label_names: Sequence[str],
    label_descriptions: Mapping[str, Any],
    examples: Mapping[str, str | None],
    target: str = Target.gold,
    bundle_length: int | None = None,
    gold_questions: bool = False,
) -> str:
    """The worker instructions of one dataset as Markdown."""
    missing = [n for n in label_names if n not in label_descriptions]
    if not label_descriptions:
        logging.getLogger(__name__).warning(
            "dataset %s has no label_descriptions: the worker instructions name the labels "
            "%s without describing them (set dataset.label_descriptions.<label>)",
            dataset_name, list(label_names),
        )  # fmt: skip
    elif missing:  # some described, some not: a typo or a forgotten label
        raise ValueError(
            f"dataset {dataset_name}: dataset.label_descriptions lacks {missing}; "
            "every label needs a description for the worker instructions"
        )
    if target == Target.prediction:
        question = (
            "An automatic text classifier (an AI model) has read the full text and chosen one of "
            "the categories below. **Guess which category the model chose.** The model may be "
            "wrong; we ask for its answer, not for the true category."
        )
    else:
        question = "**Decide which category the text belongs to.**"
    lines = [
        f"# Instructions ({dataset_name})",
        "",
        "You will see short texts in which most words have been hidden. Every hidden word is "
        "replaced by one dot (`.`); the shown words stay in their original order, so dots "
        "between two words tell you how far apart they were.",
        "",
        question,
        "",
        "* **Judge only from the shown words.** Do not search for the text or use outside help.",
        f"* If the shown words do not tell you, answer **{IDK}**. It is a proper answer: "
        'a guess is worse than an honest "I don\'t know".',
        "* Each question stands alone; the same text may come back later with other words shown, "
        "but never twice in your set of questions.",
    ]
    if bundle_length:
        lines.append(
            f"* Your set has {bundle_length} questions and you may work on only one set of this "
            "study."
        )
    if gold_questions:
        lines.append("* A few questions show the whole text; they check attention.")
    lines += ["", "## Answer options", ""]
    for name in label_names:
        lines.append(f"### {name}")
        lines.append("")
        if name in label_descriptions:
            lines.append(str(label_descriptions[name]))
            lines.append("")
        ex = examples.get(name)
        if ex:
            lines.append(f"Example (full text): _{ex}_")
        else:
            lines.append("Example: none available in this run.")
        lines.append("")
    lines.append(f"### {IDK}")
    lines.append("")
    lines.append("The shown words are not enough to choose a category.")
    lines.append("")
    demo_src = next((e for e in examples.values() if e), None)
    if demo_src:
        lines += [
            "## What a question looks like",
            "",
            "The full text:",
            "",
            f"> {demo_src}",
            "",
            "is shown with only some words, for example:",
            "",
            f"> `{_demo(demo_src)}`",
            "",
        ]
    return "\n".join(lines)


@dataclass(frozen=True)
class ExportInput:
    """What every export format is written from: the study's tasks and bundles, the explain
    run's predictions (the instructions' examples come from them), the dataset's config
    and the study's target."""

    tasks: pd.DataFrame
    bundles: pd.DataFrame
    predictions: pd.DataFrame
    dataset: Mapping[str, Any]
    target: str = Target.gold

    @property
    def label_names(self) -> list[str]:
        """The dataset's label names in class-index order."""
        return [str(n) for n in self.dataset["label_names"]]


ExportWriter = Callable[[ExportInput, Path], None]
"""Writes one export format to the given path from an :class:`ExportInput`."""


@dataclass(frozen=True)
class ExportFormat:
    """A registered export format: its name, the file it writes in a task run, its writer."""

    name: str
    filename: str
    write: ExportWriter


_REGISTRY: dict[str, ExportFormat] = {}


def register_export(name: str, filename: str) -> Callable[[ExportWriter], ExportWriter]:
    """Function decorator: write ``filename`` into every task run with the decorated
    ``write(inputs, path)``. Registration order is writing order. A name already
    registered is replaced (your own ``instructions``, say); a file name another format
    writes fails, naming that format."""

    def deco(write: ExportWriter) -> ExportWriter:
        clash = [f.name for f in _REGISTRY.values() if f.filename == filename and f.name != name]
        if clash:
            raise ValueError(
                f"export {name}: {filename!r} is written by export {clash[0]}; choose another "
                "file name, or register under that name to replace it"
            )
        _REGISTRY[name] = ExportFormat(name, filename, write)
        return write

    return deco


def unregister_export(name: str) -> None:
    """Remove a registered export format (tests, experiments)."""
    _REGISTRY.pop(name, None)


def registered_exports() -> list[ExportFormat]:
    """The registered export formats, in registration (and writing) order."""
    return list(_REGISTRY.values())


@register_export("bundles_wide", WIDE_FILE)
def write_wide(inputs: ExportInput, path: Path) -> None:
    """``bundles_wide.csv`` (:func:`bundles_wide`)."""
    bundles_wide(inputs.tasks, inputs.bundles, inputs.label_names).to_csv(path, index=False)


@register_export("bundles_long", LONG_FILE)
def write_long(inputs: ExportInput, path: Path) -> None:
    """``bundles_long.csv`` (:func:`bundles_long`)."""
    bundles_long(inputs.tasks, inputs.bundles, inputs.label_names).to_csv(path, index=False)


@register_export("instructions", INSTRUCTIONS_FILE)
def write_instructions(inputs: ExportInput, path: Path) -> None:
    """``instructions.md`` (:func:`instructions`), its examples drawn from explained samples
    that are not in the study."""
    label_names = inputs.label_names
    examples = pick_examples(inputs.predictions, set(inputs.tasks["sample_id"]), label_names)
    sizes = inputs.bundles.groupby("bundle_id").size()
    text = instructions(
        str(inputs.dataset["name"]),
        label_names,
        dict(inputs.dataset.get("label_descriptions") or {}),
        examples,
        target=inputs.target,
        bundle_length=int(sizes.max()) if len(sizes) else None,
        gold_questions=bool(inputs.bundles["is_gold"].astype(bool).any()),
    )
    path.write_text(text + "\n")


def write_exports(
    run_dir: str | Path,
    tasks: pd.DataFrame,
    bundles: pd.DataFrame,
    predictions: pd.DataFrame,
    dataset: Mapping[str, Any],
    target: str = Target.gold,
) -> list[Path]:
    """Write every registered export format into ``run_dir``; returns the files written."""
    inputs = ExportInput(tasks, bundles, predictions, dataset, target)
    written = []
    for fmt in registered_exports():
        path = Path(run_dir) / fmt.filename
        fmt.write(inputs, path)
        written.append(path)
    return written
