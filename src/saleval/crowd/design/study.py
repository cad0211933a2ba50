"""The whole study (docs/study-design.md): samples → tasks → gold → bundles → verified design."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from saleval.config.crowd import DesignError, StudyConfig
from saleval.crowd.design.bundles import assign_bundles
from saleval.crowd.design.checks import assert_design, check_design
from saleval.crowd.design.duplicates import identical_methods, methods_to_drop
from saleval.crowd.design.gold import GOLD_METHOD, select_gold
from saleval.crowd.design.sampling import interleave, select_samples
from saleval.crowd.design.tasks import build_tasks
from saleval.crowd.errors import SamplingError
from saleval.crowd.seeding import seeded_rng

log = logging.getLogger(__name__)


@dataclass
class StudyDesign:
    """Everything ``saleval-tasks`` writes, plus the drawn samples and a summary."""

    samples: pd.DataFrame
    tasks: pd.DataFrame
    bundles: pd.DataFrame
    methods: list[str]
    ks: list[int]
    info: dict[str, Any] = field(default_factory=dict)
    #: pairs of methods with the same top-k words on every study sample at every k
    #: (:func:`warn_identical`), and those of them dropped (``drop_identical``)
    identical: list[tuple[str, str]] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


def choose_methods(available: Sequence[str], study: StudyConfig, where: str) -> list[str]:
    """The study's methods: configured ones (or all available), baseline required."""
    available = sorted(set(available))
    if GOLD_METHOD in available:
        raise DesignError(f"{where}: method name {GOLD_METHOD!r} is reserved for gold questions")
    methods = list(study.methods) if study.methods else available
    missing = [m for m in methods if m not in available]
    if missing:
        raise DesignError(
            f"{where}: study.methods {missing} have no attributions; available: {available}"
        )
    if len(set(methods)) != len(methods):
        raise DesignError(f"study.methods lists a method twice: {methods}")
    if study.require_baseline and study.baseline not in methods:
        raise DesignError(
            f"{where}: the study needs the baseline method {study.baseline!r} "
            f"(methods: {methods}); explain with it or set study.require_baseline=false"
        )
    return methods


def warn_whole_texts(tasks: pd.DataFrame, ks: Sequence[int]) -> list[int]:
    """The ks at least as long as every study text: their tasks show each whole text, so
    they cannot tell methods apart. Warned (and returned), not refused: a grid shared by
    datasets of different lengths may reach past the shorter ones on purpose."""
    longest = int(tasks["n_words"].max()) if "n_words" in tasks and len(tasks) else 0
    whole = [int(k) for k in ks if k >= longest]
    if whole:
        log.warning(
            "kgrid %s: every study text has at most %d words, so the tasks of these k show "
            "whole texts and cannot tell the methods apart; choose smaller ks (kgrid.ks)",
            whole, longest,
        )  # fmt: skip
    return whole


def warn_identical(
    attributions: pd.DataFrame,
    methods: Sequence[str],
    ks: Sequence[int],
    sample_ids: Sequence[str],
    baseline: str,
    drop: bool,
    where: str = "attributions",
) -> tuple[list[tuple[str, str]], list[str]]:
    """The pairs of ``methods`` whose top-k words agree on every study sample at every k
    (:func:`saleval.crowd.design.duplicates.identical_methods`, methods in the
    attributions' order), each warned in one line; and, with ``drop``, the methods
    dropped for them (:func:`~saleval.crowd.design.duplicates.methods_to_drop`: the later
    of each pair, never the baseline), also warned. Without ``drop`` nothing is dropped."""
    order = [str(m) for m in attributions["method"].unique() if m in set(methods)]
    pairs = identical_methods(attributions, order, ks, sample_ids, where)
    for a, b in pairs:
        log.warning(
            "methods %s and %s give identical top-k words on all %d study samples at every k "
            "of %s: the crowd would answer the same tasks twice (docs/study-design.md"
            "#identical-methods); %s",
            a, b, len(sample_ids), sorted(int(k) for k in ks),
            "the later one is dropped" if drop else
            "saleval-tasks drop_duplicate_methods=true drops the later one (or leave one "
            "out of study.methods)",
        )  # fmt: skip
    dropped = methods_to_drop(pairs, order, keep={baseline}) if drop else []
    if dropped:
        log.warning("methods dropped from the study as identical to another: %s", dropped)
    return pairs, dropped


def build_study(
    predictions: pd.DataFrame,
    attributions: pd.DataFrame,
    label_names: Sequence[str],
    study: StudyConfig,
    ks: Sequence[int],
    where: str = "explain run",
    drop_identical: bool = False,
) -> StudyDesign:
    """Samples → tasks → bundles → verified design (docs/study-design.md).

    Methods with the same top-k words on every drawn sample at every k are warned
    (:func:`warn_identical`); ``drop_identical`` drops the later of each such pair before
    the tasks are built (the samples are drawn first, so they are the same either way)."""
    methods = choose_methods(attributions["method"].unique(), study, where)
    ks = sorted({int(k) for k in ks})
    samples = _draw_samples(
        predictions, label_names, study, _eligible(predictions, attributions, methods), where
    )
    n = len(samples)
    identical, dropped = warn_identical(
        attributions,
        methods,
        ks,
        samples["sample_id"].astype(str).tolist(),
        study.baseline,
        drop_identical,
        f"{where}: attributions",
    )
    methods = [m for m in methods if m not in set(dropped)]
    bundle_size = int(study.bundle_size) if study.bundle_size else n
    tasks = build_tasks(
        samples,
        attributions,
        methods,
        ks,
        study.target,
        float(study.noise),
        int(study.seed),
        f"{where}: attributions",
    )
    warn_whole_texts(tasks, ks)
    gold, gold_per_bundle = _gold(predictions, samples, label_names, study, bundle_size)
    bundles = _assign(tasks, samples, methods, ks, study, bundle_size, gold, gold_per_bundle)
    all_tasks = pd.concat([tasks, gold], ignore_index=True) if len(gold) else tasks
    _verify(all_tasks, bundles, study, bundle_size, n)
    info = {
        "n_samples": n,
        "n_methods": len(methods),
        "n_k": len(ks),
        "n_tasks": len(tasks),
        "n_gold_tasks": len(gold),
        "n_bundles": int(bundles["bundle_id"].nunique()),
        "bundle_size": bundle_size,
        "gold_per_bundle": gold_per_bundle,
        "repeats": int(study.repeats),
        "n_all_shown": int(tasks["all_shown"].sum()),
        "n_identical_pairs": len(identical),
        "n_dropped_methods": len(dropped),
    }
    log.info("study design: %s", info)
    return StudyDesign(samples, all_tasks, bundles, methods, ks, info, identical, dropped)


def _eligible(
    predictions: pd.DataFrame, attributions: pd.DataFrame, methods: Sequence[str]
) -> set[Any]:
    """The samples every study method explained with at least one word: only they can be
    drawn (the others are counted in a warning)."""
    cover = (
        attributions[attributions["method"].isin(methods)].groupby("sample_id")["method"].nunique()
    )
    eligible = set(cover.index[cover == len(methods)])
    if len(eligible) < predictions["sample_id"].nunique():
        log.warning(
            "%d explained samples lack attributions for some of %s and are not eligible",
            predictions["sample_id"].nunique() - len(eligible),
            methods,
        )
    return eligible


def _draw_samples(
    predictions: pd.DataFrame,
    label_names: Sequence[str],
    study: StudyConfig,
    eligible: set[Any],
    where: str,
) -> pd.DataFrame:
    """The study's samples (:func:`select_samples`); too few to draw is a design error."""
    try:
        return select_samples(
            predictions,
            int(study.n_samples),
            label_names,
            population=study.population,
            balance_by=study.balance_by,
            seed=int(study.seed),
            eligible=eligible,
            where=f"{where}: predictions",
        )
    except SamplingError as err:
        raise DesignError(str(err)) from err


def _gold(
    predictions: pd.DataFrame,
    samples: pd.DataFrame,
    label_names: Sequence[str],
    study: StudyConfig,
    bundle_size: int,
) -> tuple[pd.DataFrame, int]:
    """The gold tasks (empty without gold) and how many each bundle gets: study.gold_rate
    of B, rounded, but at least one when the rate is positive."""
    gold_per_bundle = round(float(study.gold_rate) * bundle_size)
    if study.gold_rate > 0 and gold_per_bundle == 0:
        gold_per_bundle = 1
    gold = pd.DataFrame()
    if gold_per_bundle:
        gold = select_gold(
            predictions,
            set(samples["sample_id"]),
            label_names,
            max(int(study.gold_pool), gold_per_bundle),
            int(study.gold_max_words),
        )
    return gold, gold_per_bundle


def _assign(
    tasks: pd.DataFrame,
    samples: pd.DataFrame,
    methods: Sequence[str],
    ks: Sequence[int],
    study: StudyConfig,
    bundle_size: int,
    gold: pd.DataFrame,
    gold_per_bundle: int,
) -> pd.DataFrame:
    """The bundles (:func:`assign_bundles`): one seeded sample order per repeat, the gold
    tasks mixed in."""
    orders = [
        interleave(samples, seeded_rng(int(study.seed), "order", a))
        for a in range(int(study.repeats))
    ]
    return assign_bundles(
        tasks,
        orders,
        methods,
        ks,
        bundle_size,
        int(study.repeats),
        int(study.seed),
        gold_ids=gold["task_id"].tolist() if len(gold) else [],
        gold_per_bundle=gold_per_bundle,
    )


def _verify(
    all_tasks: pd.DataFrame, bundles: pd.DataFrame, study: StudyConfig, bundle_size: int, n: int
) -> None:
    """Refuse a design that breaks a constraint (:func:`check_design`); when only the
    balance is off because B does not divide N, the error says so and how to fix it."""
    violations = check_design(
        all_tasks,
        bundles,
        int(study.repeats),
        bundle_size,
        int(study.balance_tolerance),
        nested=float(study.noise) == 0.0,
    )
    try:
        assert_design(violations)
    except DesignError as err:
        only_balance = {v.constraint for v in violations} <= {"method_balance", "k_balance"}
        if only_balance and n % bundle_size:
            raise DesignError(
                f"{err}\nB={bundle_size} does not divide N={n}, so bundles straddle two passes "
                "over the samples and their method/k mix can be off by one; choose B dividing N "
                "or allow it with study.balance_tolerance=1"
            ) from err
        raise
