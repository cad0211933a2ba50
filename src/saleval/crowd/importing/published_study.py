"""The original study's own samples and tasks (Lu et al. 2024) as inputs to saleval.

The published file (:mod:`saleval.crowd.importing.published_format`) holds, per sample,
the full text and the exact text workers saw for every method and k. This module turns
it into

* a task set (:func:`read_study`): ``tables.TASKS`` rows a simulated crowd can answer,
  next to the published A[i, j, k] those tasks earned from people;
* datasets (:func:`read_lu2024_imdb`, :func:`read_lu2024_ag_news`, the ``_target_`` of
  ``conf/dataset/lu2024_*.yaml``): the 100 samples as the test split, with their word
  pieces joined back into words, and the shared dataset's *other* texts as train and
  validation;
* :func:`exclude_texts`: the one rule that keeps the study's samples out of anything a
  model or a simulated reader learns from. The published AG News samples also occur in
  the shared AG News file, so it matters.

Texts are matched by :func:`text_key`, which survives the published file's lower-cased
word-piece spelling.

>>> join_word_pieces("the wine ##ries are homo ##gen ##ized , don ' t you think ?")
"the wineries are homogenized, don't you think?"
>>> text_key("The wineries are homogenized, don't you think?")
'the wineries are homogenized don t you think'
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pandas as pd

from saleval.config import DatasetConfig, DatasetFiles
from saleval.crowd.design import assign_bundles, task_id
from saleval.crowd.design.sampling import interleave
from saleval.crowd.errors import CrowdImportError
from saleval.crowd.importing.published_format import _read_blocks, read_lu2024
from saleval.crowd.importing.source import CrowdTasks
from saleval.crowd.seeding import seeded_rng
from saleval.modeling.data import DatasetSplits, _file, read_ag_news, read_imdb
from saleval.modeling.data_checks import DataError
from saleval.modeling.splits import stratified_split
from saleval.pipeline import tables

_PIECE = re.compile(r" ##")
# AG News entities survive in the published texts as '# 39 ;' and 'quot ;'
_ENTITY = re.compile(r"(?:#\s*(\d+)|\b(quot|amp|lt|gt|nbsp|apos))\s*;")
_BEFORE = re.compile(r" ([.,!?;:%)\]}])")
_AFTER = re.compile(r"([(\[{$]) ")
_APOSTROPHE = re.compile(r"(\w) ' (\w)")
_KEY_TOKEN = re.compile(r"[a-z0-9]+")
KEY_TOKENS = 8
"""Leading tokens compared by :func:`text_key`. Published IMDB texts are cut at BERT's
512 tokens and published AG News texts keep markup the shared copy's cleaner drops, so
whole texts cannot be compared; eight tokens match every published sample to its shared
copy, and a chance match only removes one more training text."""


def join_word_pieces(text: str) -> str:
    """Word pieces joined into words, AG News entities decoded, and BERT's spaces around
    punctuation undone."""
    text = _PIECE.sub("", _decode_entities(text))
    text = _APOSTROPHE.sub(r"\1'\2", text)
    text = _BEFORE.sub(r"\1", text)
    return _AFTER.sub(r"\1", text)


def _decode_entities(text: str) -> str:
    return _ENTITY.sub(
        lambda m: html.unescape(f"&#{m.group(1)};" if m.group(1) else f"&{m.group(2)};"), text
    )


def text_key(text: str, n_tokens: int = KEY_TOKENS) -> str:
    """A text's first ``n_tokens`` lower-cased ASCII alphanumeric tokens: equal for a
    text and its published (uncased word-piece) spelling."""
    flat = (
        unicodedata.normalize("NFKD", join_word_pieces(text))
        .encode("ascii", "ignore")
        .decode()
        .lower()
    )
    return " ".join(_KEY_TOKEN.findall(flat.replace("<br />", " "))[:n_tokens])


def exclude_texts(frame: pd.DataFrame, texts: Iterable[str]) -> tuple[pd.DataFrame, int]:
    """``frame`` without the rows whose ``text`` is one of ``texts`` (by :func:`text_key`);
    returns the kept rows and how many were dropped."""
    keys = {text_key(t) for t in texts}
    hit = frame["text"].astype(str).map(text_key).isin(keys)
    return frame[~hit].reset_index(drop=True), int(hit.sum())


def reader_training_data(
    splits: DatasetSplits, names: Sequence[str], study_texts: Iterable[str]
) -> tuple[pd.DataFrame, int]:
    """What a simulated crowd's reader may learn from for a published study: the named
    dataset splits together, every study text removed (:func:`exclude_texts`), so the
    reader never saw a text it is asked about. Returns the rows and how many were removed."""
    pool = pd.concat([splits[s] for s in names], ignore_index=True)
    return exclude_texts(pool, study_texts)


def read_study(
    path: str | Path,
    label_names: Sequence[str],
    dataset: str,
    methods: Mapping[str, str] | None = None,
) -> CrowdTasks:
    """Tasks, samples and published A of one published file, checked row by row as
    :func:`saleval.crowd.importing.published_format.read_lu2024` checks them."""
    rows, rejects, info = _read_blocks(path, label_names, dataset, methods)
    if rows.empty:
        raise CrowdImportError(f"{path}: no task row accepted; see the rejected rows")
    samples = pd.DataFrame(
        [
            {"sample_id": sid, "text": join_word_pieces(text), "label": label}
            for sid, (label, text) in info.pop("samples").items()
            if label >= 0
        ]
    )
    tasks = rows.assign(
        task_id=[task_id(s, m, k) for s, m, k in zip(rows["sample_id"], rows["method"], rows["k"])],
        is_gold=False,
    )
    tasks = tables.TASKS.validate(
        tasks[
            [
                "task_id",
                "sample_id",
                "method",
                "k",
                "label",
                "display_text",
                "n_words_shown",
                "is_gold",
            ]
        ].reset_index(drop=True),
        where=str(path),
    )
    aggregated = tables.AGGREGATED.validate(
        rows[["sample_id", "method", "k", "correct", "label"]].reset_index(drop=True),
        where=str(path),
    )
    return CrowdTasks(tasks, samples, aggregated, rejects, info)


# ---------------------------------------------------------------------------------
# Datasets: conf/dataset/lu2024_imdb.yaml, conf/dataset/lu2024_ag_news.yaml
# ---------------------------------------------------------------------------------


def _label_names(dc: DatasetConfig) -> list[str]:
    """The published files hold label indices: their names must be configured."""
    if not dc.label_names:
        raise CrowdImportError(f"dataset {dc.name}: set dataset.label_names (the published labels)")
    return list(dc.label_names)


def _published_split(
    dc: DatasetConfig, published_name: str, base: dict[str, pd.DataFrame]
) -> dict[str, pd.DataFrame]:
    """Test: the published samples (``files.test``); train/validation: every split of the
    shared dataset ``base`` without them, split again seeded and stratified."""
    study = read_study(_file(dc, "test"), _label_names(dc), published_name)
    rest, n_excluded = exclude_texts(
        pd.concat(base.values(), ignore_index=True), study.samples["text"]
    )
    if rest.empty:
        raise DataError(f"dataset {dc.name}: no text of {dc.files.all} is left for training")
    val = float(dc.split_fractions.get("validation", 0.1))
    parts = stratified_split(rest, {"validation": val / 2, "test": val / 2}, dc.seed)
    train = parts["train"]
    validation = pd.concat([parts["validation"], parts["test"]], ignore_index=True)
    train.attrs["n_excluded"] = n_excluded
    return {"train": train, "validation": validation, "test": study.samples}


def read_lu2024_imdb(dc: DatasetConfig) -> dict[str, pd.DataFrame]:
    """The original study's 100 IMDB samples (``files.test``: the published IMDB file) as
    the test split; the shared IMDB sample (``files.all``) minus them as train/validation."""
    base = read_imdb(replace(dc, files=DatasetFiles(all=dc.files.all)))
    return _published_split(dc, "imdb", base)


def read_lu2024_ag_news(dc: DatasetConfig) -> dict[str, pd.DataFrame]:
    """The original study's 100 AG News samples (``files.test``: the published AGNEWS file)
    as the test split; the shared AG News file (``files.all``) minus them as
    train/validation."""
    base = read_ag_news(replace(dc, files=DatasetFiles(test=dc.files.all)))
    return _published_split(dc, "ag_news", base)


def study_bundles(study: CrowdTasks, repeats: int, bundle_size: int, seed: int) -> pd.DataFrame:
    """Bundles for a simulated crowd to answer the published tasks the way a new study's
    crowd would (:func:`saleval.crowd.design.assign_bundles`): every task ``repeats``
    times, no bundle with two tasks of one sample, methods and k mixed evenly."""
    orders = [
        interleave(study.samples, seeded_rng(seed, "order", a), by="label") for a in range(repeats)
    ]
    methods = sorted(study.tasks["method"].unique())
    ks = sorted(int(k) for k in study.tasks["k"].unique())
    return assign_bundles(study.tasks, orders, methods, ks, bundle_size, repeats, seed)


LU2024_READERS = {
    "saleval.crowd.importing.published_study.read_lu2024_imdb": "imdb",
    "saleval.crowd.importing.published_study.read_lu2024_ag_news": "ag_news",
}
"""The dataset readers whose test split is a published study (``conf/dataset/lu2024_*``)."""


def published_verdicts(dc: DatasetConfig) -> pd.DataFrame:
    """The published crowd's verdicts A[i, j, k] (``tables.AGGREGATED``) on the test split
    of a dataset whose reader is one of :data:`LU2024_READERS`."""
    published, _, _ = read_lu2024(_file(dc, "test"), _label_names(dc), dc.name)
    return published
