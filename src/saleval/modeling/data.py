"""Datasets (docs/data-and-models.md): one loader per source, all returning :class:`DatasetSplits`.

Every split is a DataFrame with ``sample_id`` (stable across runs and machines),
``text`` (cleaned, what the model and the crowd see) and ``label`` (int index into
``label_names``). ERASER movies also carries ``rationale_spans``: the human
rationale as a list of ``[char_start, char_end)`` pairs into ``text``.

Sources are explicit: ``source: files`` reads the shared files under
``data_root`` with the reader the config's ``_target_`` names (``read_ag_news``,
``read_local``, ...); ``source: hub`` goes through Hugging Face ``datasets`` and fails
offline with one message naming the ``files`` alternative. Nothing falls back
silently from one to the other. ``read_local`` reads a user's own CSV/TSV/JSONL/Parquet
files (``docs/own-data.md``); every problem with them fails in one :class:`DataError`
line naming the file, the rows and the fix.

What the readers share is one module each: :mod:`~saleval.modeling.data_checks` (the
error and the checks), :mod:`~saleval.modeling.splits` (seeded, stratified splits and
subsamples), :mod:`~saleval.modeling.local_files` (a user's own files).
"""

from __future__ import annotations

import html
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.utils import get_method
from omegaconf import OmegaConf
from omegaconf.errors import (
    ConfigKeyError,
    InterpolationResolutionError,
    MissingMandatoryValue,
    ValidationError,
)
from sklearn.model_selection import train_test_split

from saleval.config import DatasetConfig, DataSource
from saleval.modeling.data_checks import (
    DataError,
    count_rows,
    is_blank,
    labels_from_names,
    require_file,
    row_numbers,
)
from saleval.modeling.local_files import check_columns, files_of, label_names_in_data, read_table
from saleval.modeling.splits import SPLITS, split_off, stratified_split, subsample
from saleval.schema import to_schema

log = logging.getLogger(__name__)


@dataclass
class DatasetSplits:
    name: str
    label_names: list[str]
    splits: dict[str, pd.DataFrame]
    source: str
    info: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, split: str) -> pd.DataFrame:
        if split not in self.splits:
            raise KeyError(f"dataset {self.name} has no split {split!r}; has {list(self.splits)}")
        return self.splits[split]

    @property
    def num_labels(self) -> int:
        return len(self.label_names)


# ---------------------------------------------------------------------------------
# Text cleaning
# ---------------------------------------------------------------------------------

# AG News lost its '&': entities survive as ' #39;', ' quot;' (one space standing for
# the '&') or intact as '&lt;'. Markup tags of real HTML elements are dropped; other
# angle-bracket content (stock tickers such as <AAPL.O>) is text and stays.
_AG_ENTITY = re.compile(r"(?:&| )?(#\d+|#x[0-9a-fA-F]+|quot|amp|lt|gt|nbsp|apos);")
_HTML_TAG = re.compile(r"</?(?:a|b|i|u|p|br|font|em|strong|span|div|img)\b[^>]*>", re.IGNORECASE)
_BR = re.compile(r"<br\s*/?>", re.IGNORECASE)
_SPACES = re.compile(r"[ \t]+")


def clean_ag_news(text: str) -> str:
    """Undo AG News' escaping: backslash = line break, '#36;'-style entities, markup."""
    text = text.replace("\\", "\n")
    text = _AG_ENTITY.sub(lambda m: html.unescape(f"&{m.group(1)};"), text)
    text = _HTML_TAG.sub(" ", text)
    return _SPACES.sub(" ", text).strip()


def clean_imdb(text: str) -> str:
    """IMDB reviews hold '<br />' line breaks; they become newlines."""
    text = _BR.sub("\n", text)
    return _SPACES.sub(" ", text).strip()


# ---------------------------------------------------------------------------------
# Readers (the _target_ of conf/dataset/*.yaml) and the loader
# ---------------------------------------------------------------------------------


def dataset_config(cfg: DatasetConfig | Mapping[str, Any] | Any) -> DatasetConfig:
    """A ``conf/dataset`` node (composed, or read back from a run's ``config.yaml``) as the
    typed :class:`DatasetConfig`: unknown keys and wrong types fail naming the key.

    >>> dataset_config({"name": "d", "label_names": ["a", "b"], "data_root": "/x"}).source
    <DataSource.files: 'files'>
    >>> dataset_config({"name": "d", "label_names": ["a"], "text_colum": "t"})
    Traceback (most recent call last):
    ...
    saleval.modeling.data_checks.DataError: dataset config: Key 'text_colum' not in 'DatasetConfig' (full key: text_colum); see conf/dataset/local.yaml for the keys
    """
    try:
        return to_schema(DatasetConfig, cfg)
    except (
        ValidationError,
        ConfigKeyError,
        InterpolationResolutionError,
        MissingMandatoryValue,
    ) as err:
        msg = str(err).splitlines()[0]
        key = getattr(err, "full_key", None)
        where = f" (full key: {key})" if key else ""
        raise DataError(
            f"dataset config: {msg}{where}; see conf/dataset/local.yaml for the keys"
        ) from err


def load_dataset(cfg: DatasetConfig | Mapping[str, Any] | Any) -> DatasetSplits:
    """Load the dataset a ``conf/dataset`` node describes, limits applied.

    ``source: files`` calls the reader named by the node's ``_target_``.
    """
    dc = dataset_config(cfg)
    if dc.source == DataSource.hub:
        splits = _load_hub(dc)
    else:
        try:
            reader: Callable[[DatasetConfig], dict[str, pd.DataFrame]] = get_method(dc._target_)
        except Exception as err:
            raise DataError(
                f"dataset {dc.name}: _target_={dc._target_!r} is not a reader "
                f"(e.g. saleval.modeling.data.read_local): {err}"
            ) from err
        splits = reader(dc)
    names = names_of(dc)
    limits = {"train": dc.max_train, "validation": dc.max_validation, "test": dc.max_test}
    for split, n in limits.items():
        if split in splits:
            splits[split] = subsample(splits[split], n, dc.seed, f"dataset.max_{split}")
    for split, df in splits.items():
        dup = df["sample_id"].duplicated()
        if dup.any():
            raise DataError(
                f"dataset {dc.name}: split {split} repeats sample ids "
                f"{df['sample_id'][dup].head(3).tolist()}; sample ids must be unique"
            )
    info = {f"n_{s}": len(df) for s, df in splits.items()}
    log.info("dataset %s from %s: %s", dc.name, dc.source, info)
    return DatasetSplits(dc.name, names, splits, str(dc.source), info)


def names_of(dc: DatasetConfig) -> list[str]:
    """``dataset.label_names``, or (not given) the labels found in a local dataset's files."""
    return list(dc.label_names) if dc.label_names is not None else label_names_in_data(dc)


def _file(dc: DatasetConfig, split: str) -> Path:
    """``dataset.files.<split>`` under ``data_root``, required to exist."""
    rel = getattr(dc.files, split)
    if rel is None:
        raise DataError(f"dataset {dc.name}: set dataset.files.{split}")
    return require_file(Path(rel) if Path(rel).is_absolute() else Path(dc.data_root, rel), dc.name)


def read_ag_news(dc: DatasetConfig) -> dict[str, pd.DataFrame]:
    """AG News CSV (class, title, description) of ``files.test``, split here."""
    path = _file(dc, "test")
    raw = pd.read_csv(
        path, header=None, names=["class", "title", "description"], dtype=str, keep_default_na=False
    )
    bad = ~raw["class"].isin([str(i) for i in range(1, len(names_of(dc)) + 1)])
    if bad.any():
        row = int(bad.idxmax())
        raise DataError(f"{path}: row {row + 1}, field class: {raw['class'][row]!r} not in 1..4")
    df = pd.DataFrame(
        {
            "sample_id": [f"ag_news-{i}" for i in range(len(raw))],
            "text": [clean_ag_news(f"{t} {d}") for t, d in zip(raw["title"], raw["description"])],
            "label": raw["class"].astype(int) - 1,
        }
    )
    return stratified_split(df, dc.split_fractions, dc.seed, str(path), names_of(dc))


def read_imdb(dc: DatasetConfig) -> dict[str, pd.DataFrame]:
    """The IMDB sample CSV of ``files.all`` (text, label), split here."""
    path = _file(dc, "all")
    raw = pd.read_csv(path, index_col=0)
    for col in ("text", "label"):
        if col not in raw.columns:
            raise DataError(f"{path}: missing column {col!r}")
    df = pd.DataFrame(
        {
            "sample_id": [f"imdb-{i}" for i in raw.index],
            "text": [clean_imdb(t) for t in raw["text"].astype(str)],
            "label": labels_from_names(raw["label"], names_of(dc), str(path)).to_numpy(),
        }
    )
    return stratified_split(df, dc.split_fractions, dc.seed, str(path), names_of(dc))


def _read_tsv(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, sep="\t", quoting=3, dtype={"label": "int64"}, keep_default_na=False)


def read_sst2(dc: DatasetConfig) -> dict[str, pd.DataFrame]:
    """GLUE SST-2 TSVs: ``files.train`` (split into train/validation) and ``files.test``
    (GLUE's labelled dev set)."""
    train_path, dev_path = _file(dc, "train"), _file(dc, "test")
    train, dev = _read_tsv(train_path), _read_tsv(dev_path)

    def frame(raw: pd.DataFrame, tag: str) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "sample_id": [f"sst2-{tag}-{i}" for i in range(len(raw))],
                "text": raw["text"].astype(str).str.strip(),
                "label": raw["label"].astype("int64"),
            }
        )

    frac = float(dc.split_fractions.get("validation", 0.1))
    tr, va = train_test_split(
        frame(train, "train"), test_size=frac, random_state=dc.seed, stratify=train["label"]
    )
    # GLUE's test labels are hidden: the dev set is our test set (docs/data-and-models.md#datasets).
    return {
        "train": tr.reset_index(drop=True),
        "validation": va.reset_index(drop=True),
        "test": frame(dev, "dev"),
    }


ERASER_SPLIT_FILES = {"train": "train.jsonl", "validation": "val.jsonl", "test": "test.jsonl"}
"""ERASER's annotation file of each split, in its directory (beside ``docs/``)."""


def eraser_root(dc: DatasetConfig) -> Path:
    """The ERASER directory a dataset config names (``files.all``)."""
    return _file(dc, "all")


def read_eraser_movies(dc: DatasetConfig) -> dict[str, pd.DataFrame]:
    """The ERASER directory of ``files.all``: {train,val,test}.jsonl and docs/.

    Besides the text and its rationale as character spans, each row keeps ERASER's own
    ids (``annotation_id``, ``docid``) and the evidence as annotated, token spans
    ``[start_token, end_token)`` (``evidence_tokens``), for ERASER's own convention of
    the plausibility metrics (docs/metrics.md#eraser)."""
    root = eraser_root(dc)
    require_file(root / "docs", dc.name)
    label_of = {"NEG": 0, "POS": 1}
    out = {}
    for split, fname in ERASER_SPLIT_FILES.items():
        path = require_file(root / fname, dc.name)
        rows = []
        for lineno, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            ann = json.loads(line)
            docid = ann.get("docids") or [ann["annotation_id"]]
            doc_path = require_file(root / "docs" / docid[0], dc.name)
            text, token_spans = _join_pretokenised(doc_path.read_text())
            if ann["classification"] not in label_of:
                raise DataError(
                    f"{path}: row {lineno}, field classification: {ann['classification']!r}"
                )
            spans, evidence = [], []
            for group in ann.get("evidences", []):
                for ev in group:
                    s, e = int(ev["start_token"]), int(ev["end_token"])
                    if not 0 <= s < e <= len(token_spans):
                        raise DataError(
                            f"{path}: row {lineno}, field evidences: token span {s}:{e} "
                            f"outside document of {len(token_spans)} tokens"
                        )
                    spans.append([token_spans[s][0], token_spans[e - 1][1]])
                    evidence.append([s, e])
            rows.append(
                {
                    "sample_id": ann["annotation_id"].removesuffix(".txt"),
                    "text": text,
                    "label": label_of[ann["classification"]],
                    "rationale_spans": spans,
                    "annotation_id": ann["annotation_id"],
                    "docid": docid[0],
                    "evidence_tokens": evidence,
                }
            )
        out[split] = pd.DataFrame(rows)
    return out


def _join_pretokenised(doc: str) -> tuple[str, list[tuple[int, int]]]:
    """ERASER docs: tokens split by spaces, sentences by newlines → text + token char spans."""
    spans: list[tuple[int, int]] = []
    parts: list[str] = []
    pos = 0
    for s_idx, sentence in enumerate(doc.strip("\n").split("\n")):
        if s_idx:
            parts.append("\n")
            pos += 1
        for t_idx, tok in enumerate(sentence.split()):
            if t_idx:
                parts.append(" ")
                pos += 1
            spans.append((pos, pos + len(tok)))
            parts.append(tok)
            pos += len(tok)
    return "".join(parts), spans


# -- read_local: a user's own files --------------------------------------------------


def complete_label_names(cfg: Any) -> None:
    """Fill a composed config's missing ``dataset.label_names`` from the data, so the run's
    ``config.yaml`` and provenance record the names every later stage reads."""
    node = OmegaConf.select(cfg, "dataset", default=None)
    if node is None or node.get("label_names") is not None:
        return
    dc = dataset_config(node)
    names = label_names_in_data(dc)
    log.info("dataset %s: label names from the data: %s", node.get("name"), names)
    node.label_names = names


def read_local(dc: DatasetConfig) -> dict[str, pd.DataFrame]:
    """A user's CSV/TSV/JSONL/Parquet files with a text and a label column (names set by
    ``dataset.text_column`` / ``label_column``; ``id_column`` optional).

    ``files.all``: one file, split seeded and stratified by ``split_fractions``;
    ``files.train`` + ``files.test`` (+ ``files.validation``, else held out of train).
    Every problem fails naming the file, the rows and the fix (``docs/own-data.md``).
    """
    files = files_of(dc)
    names = names_of(dc)

    def read(path: Path) -> pd.DataFrame:
        raw = read_table(path)
        check_columns(raw, dc, path)
        empty = is_blank(raw[dc.text_column])
        if empty.any():
            raise DataError(
                f"{path}: {int(empty.sum())} of {count_rows(len(raw), 'an empty', int(empty.sum()))} "
                f"{dc.text_column} ({row_numbers(empty)}); fill them in or remove them"
            )
        if dc.id_column:
            ids = raw[dc.id_column].astype(str).str.strip()
            dup = ids.duplicated(keep=False)
            if dup.any() or is_blank(raw[dc.id_column]).any():
                bad = dup | is_blank(raw[dc.id_column])
                raise DataError(
                    f"{path}: {count_rows(int(bad.sum()), 'an empty or repeated')} "
                    f"{dc.id_column} ({row_numbers(bad)}); sample ids must be unique"
                )
        else:
            ids = pd.Series([f"{path.stem}-{i}" for i in range(len(raw))], index=raw.index)
        return pd.DataFrame(
            {
                "sample_id": ids.to_numpy(),
                "text": raw[dc.text_column].astype(str).to_numpy(),
                "label": labels_from_names(
                    raw[dc.label_column], names, str(path), dc.label_column
                ).to_numpy(),
            }
        )

    if "all" in files:
        return stratified_split(
            read(files["all"]), dc.split_fractions, dc.seed, str(files["all"]), names
        )
    out = {split: read(path) for split, path in files.items()}
    if "validation" not in out:
        frac = float(dc.split_fractions.get("validation", 0.1))
        out["train"], out["validation"] = split_off(
            out["train"], frac, dc.seed, str(files["train"]), names, "hold out validation"
        )
    return {s: out[s] for s in SPLITS}


def _load_hub(dc: DatasetConfig) -> dict[str, pd.DataFrame]:
    """Hugging Face ``datasets`` (needs the hub). Offline it fails, naming the alternative."""
    hub = dc.hub
    if not hub.path:
        raise DataError(f"dataset {dc.name}: source=hub needs dataset.hub.path")
    try:
        import datasets as hf_datasets

        ds = hf_datasets.load_dataset(hub.path, hub.name)
    except Exception as err:
        raise DataError(
            f"dataset {dc.name}: could not load '{hub.path}' from the Hugging Face hub "
            f"({type(err).__name__}: {str(err)[:200]}). This machine may be offline: use "
            f"dataset.source=files to read the shared copy under {dc.data_root}."
        ) from err
    text_col, label_col = hub.text_column, hub.label_column
    frames = {}
    for ours, theirs in hub.splits.items():
        part = ds[theirs].to_pandas()
        frames[ours] = pd.DataFrame(
            {
                "sample_id": [f"{dc.name}-{theirs}-{i}" for i in range(len(part))],
                "text": part[text_col].astype(str),
                "label": part[label_col].astype("int64"),
            }
        )
    if "validation" not in frames:
        frac = float(dc.split_fractions.get("validation", 0.1))
        tr, va = train_test_split(
            frames["train"], test_size=frac, random_state=dc.seed, stratify=frames["train"]["label"]
        )
        frames["train"], frames["validation"] = tr.reset_index(drop=True), va.reset_index(drop=True)
    return frames
