"""Datasets of SPEC §1: one loader per source, all returning :class:`DatasetSplits`.

Every split is a DataFrame with ``sample_id`` (stable across runs and machines),
``text`` (cleaned, what the model and the crowd see) and ``label`` (int index into
``label_names``). ERASER movies also carries ``rationale_spans``: the human
rationale as a list of ``[char_start, char_end)`` pairs into ``text``.

Sources are explicit: ``source: files`` reads the shared files under
``data_root``; ``source: hub`` goes through Hugging Face ``datasets`` and fails
offline with one message naming the ``files`` alternative. Nothing falls back
silently from one to the other.
"""

from __future__ import annotations

import html
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from sklearn.model_selection import train_test_split

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")


class DataError(RuntimeError):
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


def stratified_split(
    df: pd.DataFrame, fractions: Mapping[str, float], seed: int
) -> dict[str, pd.DataFrame]:
    """Seeded, label-stratified train/validation/test split of one table."""
    val_frac = float(fractions.get("validation", 0.1))
    test_frac = float(fractions.get("test", 0.2))
    if not 0 < val_frac + test_frac < 1:
        raise DataError(f"split fractions must sum below 1, got {dict(fractions)}")
    rest, test = train_test_split(df, test_size=test_frac, random_state=seed, stratify=df["label"])
    train, val = train_test_split(
        rest, test_size=val_frac / (1 - test_frac), random_state=seed, stratify=rest["label"]
    )
    return {
        "train": train.reset_index(drop=True),
        "validation": val.reset_index(drop=True),
        "test": test.reset_index(drop=True),
    }


def subsample(df: pd.DataFrame, n: int | None, seed: int) -> pd.DataFrame:
    """Seeded, label-stratified subsample (keeps class balance) when ``n`` is set."""
    if n is None or n >= len(df):
        return df
    kept, _ = train_test_split(df, train_size=n, random_state=seed, stratify=df["label"])
    return kept.reset_index(drop=True)


def _require(path: Path, dataset: str) -> Path:
    if not path.exists():
        raise DataError(
            f"dataset {dataset}: file {path} not found (data root from dataset.data_root / "
            "SALEVAL_DATA_ROOT; see ../shared/data/README.md)"
        )
    return path


def _labels_from_names(values: pd.Series, label_names: Sequence[str], where: str) -> pd.Series:
    lookup = {n.lower(): i for i, n in enumerate(label_names)}
    out = []
    for row, v in enumerate(values.tolist()):
        key = str(v).strip().lower()
        if key in lookup:
            out.append(lookup[key])
        elif key.lstrip("-").isdigit() and 0 <= int(key) < len(label_names):
            out.append(int(key))
        else:
            raise DataError(
                f"{where}: row {row + 1}, field label: {v!r} is not one of {list(label_names)}"
            )
    return pd.Series(out, index=values.index, dtype="int64")


# ---------------------------------------------------------------------------------
# Loaders (targets of conf/dataset/*.yaml)
# ---------------------------------------------------------------------------------


@dataclass
class DatasetConfig:
    """Fields shared by every dataset config (``conf/dataset/*.yaml``)."""

    name: str
    label_names: list[str]
    data_root: str = ""
    source: str = "files"
    seed: int = 42
    split_fractions: dict[str, float] = field(
        default_factory=lambda: {"validation": 0.1, "test": 0.2}
    )
    max_train: int | None = None
    max_validation: int | None = None
    max_test: int | None = None
    hub: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    text_column: str = "text"
    label_column: str = "label"
    id_column: str | None = None
    label_descriptions: dict[str, Any] = field(default_factory=dict)


def load_dataset(cfg: Mapping[str, Any] | Any) -> DatasetSplits:
    """Load the dataset a ``conf/dataset`` node describes, limits applied."""
    conf = dict(cfg.items()) if hasattr(cfg, "items") else dict(cfg)
    conf = {k: (v if not hasattr(v, "items") else dict(v.items())) for k, v in conf.items()}
    conf.pop("_target_", None)
    loader_name = conf.pop("loader", conf["name"])
    known = set(DatasetConfig.__dataclass_fields__)
    dc = DatasetConfig(**{k: v for k, v in conf.items() if k in known})
    dc.label_names = list(dc.label_names)
    if dc.source == "hub":
        splits = _load_hub(dc)
    elif dc.source == "files":
        try:
            fn = _FILE_LOADERS[loader_name]
        except KeyError as err:
            raise DataError(
                f"no file loader {loader_name!r}; known: {sorted(_FILE_LOADERS)}"
            ) from err
        splits = fn(dc)
    else:
        raise DataError(f"dataset {dc.name}: source must be 'files' or 'hub', got {dc.source!r}")
    limits = {"train": dc.max_train, "validation": dc.max_validation, "test": dc.max_test}
    for split, n in limits.items():
        if split in splits:
            splits[split] = subsample(splits[split], n, dc.seed)
    for split, df in splits.items():
        if df["sample_id"].duplicated().any():
            raise DataError(f"dataset {dc.name}: duplicate sample_id in split {split}")
    info = {f"n_{s}": len(df) for s, df in splits.items()}
    log.info("dataset %s from %s: %s", dc.name, dc.source, info)
    return DatasetSplits(dc.name, dc.label_names, splits, dc.source, info)


def _ag_news(dc: DatasetConfig) -> dict[str, pd.DataFrame]:
    path = _require(Path(dc.data_root, dc.files.get("test", "ag_news/test.csv")), dc.name)
    raw = pd.read_csv(
        path, header=None, names=["class", "title", "description"], dtype=str, keep_default_na=False
    )
    bad = ~raw["class"].isin([str(i) for i in range(1, len(dc.label_names) + 1)])
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
    return stratified_split(df, dc.split_fractions, dc.seed)


def _imdb(dc: DatasetConfig) -> dict[str, pd.DataFrame]:
    path = _require(Path(dc.data_root, dc.files.get("all", "imdb/imdb_small_3000.csv")), dc.name)
    raw = pd.read_csv(path, index_col=0)
    for col in ("text", "label"):
        if col not in raw.columns:
            raise DataError(f"{path}: missing column {col!r}")
    df = pd.DataFrame(
        {
            "sample_id": [f"imdb-{i}" for i in raw.index],
            "text": [clean_imdb(t) for t in raw["text"].astype(str)],
            "label": _labels_from_names(raw["label"], dc.label_names, str(path)).to_numpy(),
        }
    )
    return stratified_split(df, dc.split_fractions, dc.seed)


def _read_tsv(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, sep="\t", quoting=3, dtype={"label": "int64"}, keep_default_na=False)


def _sst2(dc: DatasetConfig) -> dict[str, pd.DataFrame]:
    train_path = _require(Path(dc.data_root, dc.files.get("train", "sst2/train.tsv")), dc.name)
    dev_path = _require(Path(dc.data_root, dc.files.get("dev", "sst2/dev.tsv")), dc.name)
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
    # GLUE's test labels are hidden: the dev set is our test set (SPEC §1).
    return {
        "train": tr.reset_index(drop=True),
        "validation": va.reset_index(drop=True),
        "test": frame(dev, "dev"),
    }


def _eraser_movies(dc: DatasetConfig) -> dict[str, pd.DataFrame]:
    root = Path(dc.data_root, dc.files.get("root", "eraser_movies"))
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


def _local(dc: DatasetConfig) -> dict[str, pd.DataFrame]:
    """Any CSV/JSONL/Parquet: one file per split, or one file split like AG News."""
    if not dc.files:
        raise DataError(
            "dataset local: set dataset.files.{train,validation,test} or dataset.files.all"
        )

    def read(p: str) -> pd.DataFrame:
        path = _require(Path(p) if Path(p).is_absolute() else Path(dc.data_root, p), dc.name)
        if path.suffix in (".jsonl", ".json"):
            raw = pd.read_json(path, lines=path.suffix == ".jsonl")
        elif path.suffix == ".parquet":
            raw = pd.read_parquet(path)
        elif path.suffix in (".tsv", ".tab"):
            raw = pd.read_csv(path, sep="\t", keep_default_na=False)
        else:
            raw = pd.read_csv(path, keep_default_na=False)
        for col in (dc.text_column, dc.label_column):
            if col not in raw.columns:
                raise DataError(f"{path}: missing column {col!r}; has {list(raw.columns)}")
        empty = raw[dc.text_column].astype(str).str.strip() == ""
        if empty.any():
            raise DataError(
                f"{path}: row {int(empty.to_numpy().argmax()) + 1}, field "
                f"{dc.text_column}: empty text"
            )
        ids = (
            raw[dc.id_column].astype(str)
            if dc.id_column
            else [f"{path.stem}-{i}" for i in range(len(raw))]
        )
        return pd.DataFrame(
            {
                "sample_id": list(ids),
                "text": raw[dc.text_column].astype(str).to_numpy(),
                "label": _labels_from_names(
                    raw[dc.label_column], dc.label_names, str(path)
                ).to_numpy(),
            }
        )

    if "all" in dc.files:
        return stratified_split(read(dc.files["all"]), dc.split_fractions, dc.seed)
    missing = [s for s in SPLITS if s not in dc.files]
    if missing:
        raise DataError(
            f"dataset local: dataset.files lacks {missing} (or give files.all to split one file)"
        )
    return {s: read(dc.files[s]) for s in SPLITS}


def _load_hub(dc: DatasetConfig) -> dict[str, pd.DataFrame]:
    """Hugging Face ``datasets`` (needs the hub). Offline it fails, naming the alternative."""
    hub = dict(dc.hub)
    if "path" not in hub:
        raise DataError(f"dataset {dc.name}: source=hub needs dataset.hub.path")
    try:
        import datasets as hf_datasets

        ds = hf_datasets.load_dataset(hub["path"], hub.get("name"))
    except Exception as err:
        raise DataError(
            f"dataset {dc.name}: could not load '{hub['path']}' from the Hugging Face hub "
            f"({type(err).__name__}: {str(err)[:200]}). This machine may be offline: use "
            f"dataset.source=files to read the shared copy under {dc.data_root}."
        ) from err
    text_col, label_col = hub.get("text_column", "text"), hub.get("label_column", "label")
    frames = {}
    split_map = hub.get("splits", {"train": "train", "test": "test"})
    for ours, theirs in split_map.items():
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


_FILE_LOADERS = {
    "ag_news": _ag_news,
    "imdb": _imdb,
    "sst2": _sst2,
    "eraser_movies": _eraser_movies,
    "local": _local,
}
