"""Seeded, label-stratified splits and subsamples of a dataset's rows.

A table given whole is cut into train, validation and test by ``dataset.split_fractions``
(:func:`stratified_split`); ``dataset.max_*`` keep a class-balanced subsample
(:func:`subsample`). The same seed gives the same rows everywhere. When scikit-learn
refuses (a class too small to appear on both sides) the error is one line naming the
table, the rows per class and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
from sklearn.model_selection import train_test_split

from saleval.modeling.data_checks import (
    DataError,
)


def _class_counts(df: pd.DataFrame, label_names: Sequence[str]) -> str:
    """``negative: 1, positive: 199``: rows per class, for split errors."""
    counts = df["label"].value_counts().sort_index()
    name = {i: n for i, n in enumerate(label_names)}
    return ", ".join(f"{name.get(int(i), i)}: {int(c)}" for i, c in counts.items())


def split_off(
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
    rest, test = split_off(df, test_frac, seed, where, label_names, "split off the test set")
    train, val = split_off(
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


SPLITS = ("train", "validation", "test")
