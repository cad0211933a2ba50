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
"""

from __future__ import annotations

import html
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
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

from saleval.config.dataset import DatasetConfig, DataSource
from saleval.errors import UserError
from saleval.schema import to_schema

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")


class DataError(UserError, RuntimeError):
    """A dataset cannot be loaded; the message names the file, row or package."""


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
# Split helpers
# ---------------------------------------------------------------------------------


def _count(n: int, has: str = "", verb_n: int | None = None) -> str:
    """``1 row``, ``3 rows``; with ``has``: ``1 row has <has>``, ``3 rows have <has>``
    (the verb agreeing with ``verb_n``, default ``n``: ``1 of 40 rows has ...``)."""
    words = f"{n} row{'' if n == 1 else 's'}"
    if has:
        words += f" {'has' if (n if verb_n is None else verb_n) == 1 else 'have'} {has}"
    return words


def _class_counts(df: pd.DataFrame, label_names: Sequence[str]) -> str:
    """``negative: 1, positive: 199``: rows per class, for split errors."""
    counts = df["label"].value_counts().sort_index()
    name = {i: n for i, n in enumerate(label_names)}
    return ", ".join(f"{name.get(int(i), i)}: {int(c)}" for i, c in counts.items())


def _split_off(
    df: pd.DataFrame,
    fraction: float,
    seed: int,
    where: str,
    label_names: Sequence[str],
    what: str,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Seeded, label-stratified ``(rest, held-out fraction)`` of ``df``. scikit-learn's
    refusal (a class too small to appear on both sides) becomes one line naming ``where``,
    the rows per class and the fix."""
    try:
        rest, held = train_test_split(
            df, test_size=fraction, random_state=seed, stratify=df["label"]
        )
    except ValueError as err:
        raise DataError(
            f"{where}: cannot {what} ({fraction:.0%}) stratified by label: "
            f"{str(err).split('. ')[0]}; rows per class: "
            f"{_class_counts(df, label_names)}. Add rows to the small classes, or give "
            "dataset.files.train/validation/test"
        ) from err
    return rest.reset_index(drop=True), held.reset_index(drop=True)


def stratified_split(
    df: pd.DataFrame,
    fractions: Mapping[str, float],
    seed: int,
    where: str = "dataset",
    label_names: Sequence[str] = (),
) -> dict[str, pd.DataFrame]:
    """Seeded, label-stratified train/validation/test split of one table (``where``
    names it in errors)."""
    val_frac = float(fractions.get("validation", 0.1))
    test_frac = float(fractions.get("test", 0.2))
    if not (val_frac > 0 and test_frac > 0 and val_frac + test_frac < 1):
        raise DataError(
            f"dataset.split_fractions={dict(fractions)}: validation and test must be "
            "above 0 and sum below 1"
        )
    rest, test = _split_off(df, test_frac, seed, where, label_names, "split off the test set")
    train, val = _split_off(
        rest, val_frac / (1 - test_frac), seed, where, label_names, "split off validation"
    )
    return {"train": train, "validation": val, "test": test}


def subsample(
    df: pd.DataFrame, n: int | None, seed: int, where: str = "dataset.max_*"
) -> pd.DataFrame:
    """Seeded, label-stratified subsample (keeps class balance) when ``n`` is set."""
    if n is None or n >= len(df):
        return df
    try:
        kept, _ = train_test_split(df, train_size=n, random_state=seed, stratify=df["label"])
    except ValueError as err:
        counts = df["label"].value_counts().sort_index().to_dict()
        raise DataError(
            f"{where}={n}: cannot draw {n} of {len(df)} rows stratified by label — "
            f"{str(err).split('. ')[0]}; rows per class index: {counts}. Raise it "
            "or set it to null"
        ) from err
    return kept.reset_index(drop=True)


def _require(path: Path, dataset: str) -> Path:
    if not path.exists():
        raise DataError(
            f"dataset {dataset}: file {path} not found (data root from dataset.data_root / "
            "SALEVAL_DATA_ROOT; see ../shared/data/README.md)"
        )
    return path


def _labels_from_names(
    values: pd.Series, label_names: Sequence[str], where: str, column: str = "label"
) -> pd.Series:
    """Label names (any case) or class indices as class indices; every row that is neither
    is counted in one error naming the first and the values seen."""
    lookup = {n.lower(): i for i, n in enumerate(label_names)}
    out: list[int] = []
    bad: list[bool] = []
    for v in values.tolist():
        key = "" if v is None or (isinstance(v, float) and v != v) else str(v).strip().lower()
        if key in lookup:
            out.append(lookup[key])
        elif key.lstrip("-").isdigit() and 0 <= int(key) < len(label_names):
            out.append(int(key))
        else:
            out.append(-1)
        bad.append(out[-1] < 0)
    if any(bad):
        first = bad.index(True)
        seen = pd.Series(values.tolist())[bad].astype(str).value_counts()
        shown = ", ".join(f"{v!r} ×{c}" for v, c in seen.head(5).items())
        raise DataError(
            f"{where}: row {first + 1}, field {column}: {values.tolist()[first]!r} is not one "
            f"of {list(label_names)} ({_count(sum(bad))} in all: {shown}); fix those rows or "
            "list every label in dataset.label_names"
        )
    return pd.Series(out, index=values.index, dtype="int64")


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
    saleval.modeling.data.DataError: dataset config: Key 'text_colum' not in 'DatasetConfig' (full key: text_colum); see conf/dataset/local.yaml for the keys
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
    return DatasetSplits(dc.name, names_of(dc), splits, str(dc.source), info)


def names_of(dc: DatasetConfig) -> list[str]:
    """``dataset.label_names``, or (not given) the labels found in a local dataset's files."""
    return list(dc.label_names) if dc.label_names is not None else label_names_in_data(dc)


def _file(dc: DatasetConfig, split: str) -> Path:
    """``dataset.files.<split>`` under ``data_root``, required to exist."""
    rel = getattr(dc.files, split)
    if rel is None:
        raise DataError(f"dataset {dc.name}: set dataset.files.{split}")
    return _require(Path(rel) if Path(rel).is_absolute() else Path(dc.data_root, rel), dc.name)


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
            "label": _labels_from_names(raw["label"], names_of(dc), str(path)).to_numpy(),
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


def read_eraser_movies(dc: DatasetConfig) -> dict[str, pd.DataFrame]:
    """The ERASER directory of ``files.all``: {train,val,test}.jsonl and docs/."""
    root = _file(dc, "all")
    _require(root / "docs", dc.name)
    label_of = {"NEG": 0, "POS": 1}
    out = {}
    for split, fname in (
        ("train", "train.jsonl"),
        ("validation", "val.jsonl"),
        ("test", "test.jsonl"),
    ):
        path = _require(root / fname, dc.name)
        rows = []
        for lineno, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            ann = json.loads(line)
            docid = ann.get("docids") or [ann["annotation_id"]]
            doc_path = _require(root / "docs" / docid[0], dc.name)
            text, token_spans = _join_pretokenised(doc_path.read_text())
            if ann["classification"] not in label_of:
                raise DataError(
                    f"{path}: row {lineno}, field classification: {ann['classification']!r}"
                )
            spans = []
            for group in ann.get("evidences", []):
                for ev in group:
                    s, e = int(ev["start_token"]), int(ev["end_token"])
                    if not 0 <= s < e <= len(token_spans):
                        raise DataError(
                            f"{path}: row {lineno}, field evidences: token span {s}:{e} "
                            f"outside document of {len(token_spans)} tokens"
                        )
                    spans.append([token_spans[s][0], token_spans[e - 1][1]])
            rows.append(
                {
                    "sample_id": ann["annotation_id"].removesuffix(".txt"),
                    "text": text,
                    "label": label_of[ann["classification"]],
                    "rationale_spans": spans,
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

#: compression suffixes pandas undoes by itself (``reviews.csv.gz``)
_COMPRESSION = (".gz", ".bz2", ".xz", ".zip", ".zst")
#: what ``read_local`` reads, by file suffix
_FORMATS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".jsonl": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
}


def _rows(mask: Sequence[bool] | pd.Series, first: int = 5) -> str:
    """``rows 3, 8, 11, ...``: the first few 1-based row numbers where ``mask`` holds
    (rows count data records; a CSV's header is not a row)."""
    hits = [i + 1 for i, m in enumerate(list(mask)) if m]
    shown = ", ".join(str(i) for i in hits[:first])
    return f"row{'s' if len(hits) > 1 else ''} {shown}{', ...' if len(hits) > first else ''}"


def _blank(values: pd.Series) -> pd.Series:
    """True where a cell is null or only whitespace."""
    return values.isna() | (values.astype(str).str.strip() == "")


def read_table(path: Path) -> pd.DataFrame:
    """A CSV, TSV, JSON Lines, JSON or Parquet file as a table with at least one row.

    CSV and TSV cells are read as strings (an empty cell is ``""``, never NaN), so labels
    and ids keep their spelling. A file that is missing, empty, unparsable or holds no
    rows fails naming the file.
    """
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in _COMPRESSION:
        suffixes.pop()
    fmt = _FORMATS.get(suffixes[-1] if suffixes else "")
    if fmt is None:
        raise DataError(
            f"{path}: unknown file type {path.suffix!r}; read_local reads "
            f"{', '.join(_FORMATS)} files (optionally compressed: {', '.join(_COMPRESSION)})"
        )
    if not path.is_file():
        raise DataError(f"{path}: file not found; check dataset.data_root and dataset.files")
    if path.stat().st_size == 0:
        raise DataError(f"{path}: the file is empty (0 bytes); point dataset.files at your data")
    try:
        if fmt in ("csv", "tsv"):
            raw = pd.read_csv(
                path, sep="\t" if fmt == "tsv" else ",", dtype=str, keep_default_na=False
            )
        elif fmt == "parquet":
            raw = pd.read_parquet(path)
        else:
            raw = pd.read_json(path, lines=fmt == "jsonl", dtype=False)
    except (ValueError, OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        reason = " ".join(str(err).split())[:300]
        raise DataError(f"{path}: cannot be read as {fmt}: {reason}") from err
    if raw.empty:
        what = f"only a header ({', '.join(map(str, raw.columns))})" if len(raw.columns) else ""
        raise DataError(f"{path}: no data rows{' — ' + what if what else ''}; add rows to it")
    return raw


def _columns(raw: pd.DataFrame, dc: DatasetConfig, path: Path) -> None:
    """The configured text, label and id columns exist, or the error lists what does."""
    wanted = {
        "text_column": dc.text_column,
        "label_column": dc.label_column,
        "id_column": dc.id_column,
    }
    found = [str(c) for c in raw.columns]
    for key, col in wanted.items():
        if col is not None and col not in raw.columns:
            raise DataError(
                f"{path}: no column {col!r} (dataset.{key}); the file has columns {found}: "
                f"set dataset.{key}=<one of them>"
            )


def _local_files(dc: DatasetConfig) -> dict[str, Path]:
    """``dataset.files`` of a local dataset: ``all``, or the splits, paths resolved."""
    given = {s: getattr(dc.files, s) for s in (*SPLITS, "all") if getattr(dc.files, s)}
    if not given:
        raise DataError(
            f"dataset {dc.name}: no files given; set dataset.files.all=<file> (split here) "
            "or dataset.files.train/validation/test"
        )
    if "all" in given and len(given) > 1:
        raise DataError(
            f"dataset {dc.name}: dataset.files gives 'all' and {sorted(set(given) - {'all'})}; "
            "give either one file to split (all) or one file per split"
        )
    if "all" not in given and not {"train", "test"} <= set(given):
        raise DataError(
            f"dataset {dc.name}: dataset.files gives {sorted(given)}; give train and test "
            "(validation is optional: without it, part of train is held out) or all"
        )
    return {
        key: Path(rel) if Path(rel).is_absolute() else Path(dc.data_root, rel)
        for key, rel in given.items()
    }


def label_names_in_data(dc: DatasetConfig) -> list[str]:
    """The label values of a local dataset's files, sorted (numerically when every value
    is an integer): its label names when ``dataset.label_names`` is not given."""
    if dc._target_ != "saleval.modeling.data.read_local":
        raise DataError(
            f"dataset {dc.name}: set dataset.label_names (only saleval.modeling.data.read_local "
            "reads them from the data)"
        )
    values: set[str] = set()
    for path in _local_files(dc).values():
        raw = read_table(path)
        _columns(raw, dc, path)
        labels = raw[dc.label_column]
        blank = _blank(labels)
        if blank.any():
            raise DataError(
                f"{path}: {_count(int(blank.sum()), 'no')} {dc.label_column} "
                f"({_rows(blank)}); fill them in or remove them"
            )
        values.update(labels.astype(str).str.strip())
    if all(v.lstrip("-").isdigit() for v in values):
        return sorted(values, key=int)
    return sorted(values)


def complete_label_names(cfg: Any) -> None:
    """Fill a composed config's missing ``dataset.label_names`` from the data, so the run's
    ``config.yaml`` and provenance record the names every later stage reads."""
    node = OmegaConf.select(cfg, "dataset", default=None)
    if node is None or node.get("label_names") is not None:
        return
    names = label_names_in_data(dataset_config(node))
    log.info("dataset %s: label names from the data: %s", node.get("name"), names)
    node.label_names = names


def read_local(dc: DatasetConfig) -> dict[str, pd.DataFrame]:
    """A user's CSV/TSV/JSONL/Parquet files with a text and a label column (names set by
    ``dataset.text_column`` / ``label_column``; ``id_column`` optional).

    ``files.all``: one file, split seeded and stratified by ``split_fractions``;
    ``files.train`` + ``files.test`` (+ ``files.validation``, else held out of train).
    Every problem fails naming the file, the rows and the fix (``docs/own-data.md``).
    """
    files = _local_files(dc)
    names = names_of(dc)

    def read(path: Path) -> pd.DataFrame:
        raw = read_table(path)
        _columns(raw, dc, path)
        empty = _blank(raw[dc.text_column])
        if empty.any():
            raise DataError(
                f"{path}: {int(empty.sum())} of {_count(len(raw), 'an empty', int(empty.sum()))} "
                f"{dc.text_column} ({_rows(empty)}); fill them in or remove them"
            )
        if dc.id_column:
            ids = raw[dc.id_column].astype(str).str.strip()
            dup = ids.duplicated(keep=False)
            if dup.any() or _blank(raw[dc.id_column]).any():
                bad = dup | _blank(raw[dc.id_column])
                raise DataError(
                    f"{path}: {_count(int(bad.sum()), 'an empty or repeated')} "
                    f"{dc.id_column} ({_rows(bad)}); sample ids must be unique"
                )
        else:
            ids = pd.Series([f"{path.stem}-{i}" for i in range(len(raw))], index=raw.index)
        return pd.DataFrame(
            {
                "sample_id": ids.to_numpy(),
                "text": raw[dc.text_column].astype(str).to_numpy(),
                "label": _labels_from_names(
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
        out["train"], out["validation"] = _split_off(
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
