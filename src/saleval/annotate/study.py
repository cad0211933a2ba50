"""What the annotation app serves: one ``saleval-tasks`` run dir, read and checked once.

The app never touches the task files again after :func:`load_study`: a malformed run dir
fails here, at start-up, with the file, row and field named, instead of in front of a
worker halfway through a bundle.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from saleval.config.annotate import StudyPhase
from saleval.errors import UserError
from saleval.pipeline import tables
from saleval.pipeline.records.run_record import RunRecord
from saleval.vocab import IDK

INSTRUCTIONS = "instructions.md"


class StudyError(UserError, ValueError):
    """A task run dir cannot be served as it is."""


@dataclass(frozen=True)
class Study:
    """One task run as the app serves it.

    ``run_key`` identifies the task set in the store (the tasks run's MLflow run id),
    so answers never mix between task sets that share a database.
    """

    tasks_dir: Path
    run_key: str
    dataset: str
    label_names: tuple[str, ...]
    phase: StudyPhase  # a pilot's task set is stored apart (pilot_study)
    tasks: pd.DataFrame  # indexed by task_id
    bundles: pd.DataFrame  # bundle_id, position, task_id, is_gold in file order
    instructions_md: str
    label_descriptions: dict[str, str] = field(default_factory=dict)
    target: str = "gold"  # study.target: what the workers are asked (the comprehension check)

    @property
    def options(self) -> tuple[str, ...]:
        """Answer options in button order: the labels, then "I don't know"."""
        return (*self.label_names, IDK)

    @property
    def bundle_ids(self) -> list[str]:
        """Bundle ids in file order, the order in which the app hands them out."""
        return list(dict.fromkeys(self.bundles["bundle_id"].tolist()))

    @property
    def store_dataset(self) -> str:
        """The dataset the store's one-bundle-per-worker rule counts in: a pilot's own, so
        whether pilot participants may join the main study is ``annotate.exclude_pilot``'s."""
        return self.dataset + (PILOT_SUFFIX if self.phase == StudyPhase.pilot else "")

    def display_text(self, task_id: str) -> str:
        return str(self.tasks.at[task_id, "display_text"])


def load_study(tasks_dir: str | Path) -> Study:
    """Read and cross-check a task run dir (tasks.csv, bundles.csv, instructions, config)."""
    tasks_dir = Path(tasks_dir)
    cfg_path = tasks_dir / "config.yaml"
    if not cfg_path.is_file():
        raise StudyError(f"{cfg_path}: missing; is {tasks_dir} a saleval-tasks run dir?")
    cfg = OmegaConf.load(cfg_path)
    dataset = OmegaConf.select(cfg, "dataset.name", default=None)
    labels = OmegaConf.select(cfg, "dataset.label_names", default=None)
    if not dataset or not labels:
        raise StudyError(f"{cfg_path}: needs dataset.name and dataset.label_names")
    label_names = tuple(str(x) for x in labels)
    if IDK in label_names:
        raise StudyError(f"{cfg_path}: a label may not be named {IDK!r}")
    if len(set(label_names)) != len(label_names):
        raise StudyError(f"{cfg_path}: duplicate label names {list(label_names)}")
    node = OmegaConf.select(cfg, "dataset.label_descriptions", default=None)
    # missing, null or {}: no descriptions (the instructions then list the labels alone)
    raw = OmegaConf.to_container(node) if OmegaConf.is_dict(node) else {}
    descriptions = {str(k): str(v) for k, v in (raw or {}).items()}  # type: ignore[union-attr]

    tasks = tables.TASKS.read(tasks_dir)
    bundles = tables.BUNDLES.read(tasks_dir)
    bad_label = tasks.index[(tasks["label"] < 0) | (tasks["label"] >= len(label_names))]
    if len(bad_label):
        row = int(bad_label[0])
        raise StudyError(
            f"{tables.TASKS.path(tasks_dir)}: row {row + 1}, field 'label': "
            f"{tasks['label'].iloc[row]} is not an index into {list(label_names)}"
        )
    known = set(tasks["task_id"])
    unknown = ~bundles["task_id"].isin(known)
    if unknown.any():
        row = int(unknown.to_numpy().nonzero()[0][0])
        raise StudyError(
            f"{tables.BUNDLES.path(tasks_dir)}: row {row + 1}, field 'task_id': "
            f"{bundles['task_id'].iloc[row]!r} is not in tasks.csv"
        )
    repeated = bundles.duplicated(["bundle_id", "task_id"])
    if repeated.any():
        row = int(repeated.to_numpy().nonzero()[0][0])
        raise StudyError(
            f"{tables.BUNDLES.path(tasks_dir)}: row {row + 1}: task "
            f"{bundles['task_id'].iloc[row]!r} appears twice in bundle {bundles['bundle_id'].iloc[row]!r}"
        )

    instructions = tasks_dir / INSTRUCTIONS
    if not instructions.is_file():
        raise StudyError(
            f"{instructions}: missing; the instruction page is shown before the first task"
        )

    return Study(
        tasks_dir=tasks_dir.resolve(),
        run_key=_run_key(tasks_dir),
        dataset=str(dataset),
        label_names=label_names,
        phase=StudyPhase.main,
        tasks=tasks.set_index("task_id", drop=False),
        bundles=bundles.reset_index(drop=True),
        instructions_md=instructions.read_text(encoding="utf-8"),
        label_descriptions=descriptions,
        target=str(OmegaConf.select(cfg, "study.target", default="gold")),
    )


PILOT_SUFFIX = "/pilot"


def pilot_study(study: Study, n_bundles: int) -> Study:
    """The pilot of ``study``: its first ``n_bundles`` bundles as a task set of their own.

    Stored under ``<run key>/pilot``, so a pilot's answers and participants never mix
    with the main study's in a shared database, and the main study serves every bundle.
    """
    if n_bundles < 1:
        raise StudyError(f"annotate.pilot.bundles={n_bundles}: a pilot serves at least 1 bundle")
    keep = study.bundle_ids[:n_bundles]
    return dataclasses.replace(
        study,
        run_key=study.run_key + PILOT_SUFFIX,
        bundles=study.bundles[study.bundles["bundle_id"].isin(keep)].reset_index(drop=True),
        phase=StudyPhase.pilot,
    )


def _run_key(tasks_dir: Path) -> str:
    """The tasks run's MLflow run id, else its fingerprint, else a hash of its path."""
    if RunRecord.exists(tasks_dir):
        record = RunRecord.read(tasks_dir)
        for key in (record.run_id, record.fingerprint):
            if key:
                return key
    return "dir-" + hashlib.sha256(str(tasks_dir.resolve()).encode()).hexdigest()[:16]
