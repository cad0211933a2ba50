"""Schema of ``conf/dataset``: what a dataset is and where its files come from."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from omegaconf import MISSING


class DataSource(StrEnum):
    """``files``: the shared copy under ``data_root``; ``hub``: Hugging Face ``datasets``."""

    files = "files"
    hub = "hub"


@dataclass
class DatasetFiles:
    """Files of ``source: files``, relative to ``data_root`` unless absolute.

    One file per split, or ``all``: one file (a directory for ERASER) that the reader
    splits or that holds every split.
    """

    train: str | None = None
    validation: str | None = None
    test: str | None = None
    all: str | None = None


@dataclass
class HubConfig:
    """``source: hub``: which Hugging Face dataset, and which of its columns and splits."""

    path: str | None = None
    name: str | None = None  # the dataset's configuration name, if it has several
    text_column: str = "text"
    label_column: str = "label"
    splits: dict[str, str] = field(default_factory=lambda: {"train": "train", "test": "test"})


@dataclass
class DatasetConfig:
    """``conf/dataset/*.yaml``. ``_target_`` is the reader of ``source: files`` (a function
    of this config returning the splits), e.g. ``saleval.modeling.data.read_ag_news``."""

    _target_: str = "saleval.modeling.data.read_local"
    name: str = MISSING
    label_names: list[str] | None = None  # null: read_local takes the labels found in the data
    label_descriptions: dict[str, str] = field(default_factory=dict)
    source: DataSource = DataSource.files
    data_root: str = "${paths.data_root}"
    files: DatasetFiles = field(default_factory=DatasetFiles)
    text_column: str = "text"
    label_column: str = "label"
    id_column: str | None = None
    split_fractions: dict[str, float] = field(
        default_factory=lambda: {"validation": 0.1, "test": 0.2}
    )
    seed: int = 42
    max_train: int | None = None
    max_validation: int | None = None
    max_test: int | None = None
    hub: HubConfig = field(default_factory=HubConfig)
