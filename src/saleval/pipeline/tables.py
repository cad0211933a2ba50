"""Every table that crosses a stage boundary, declared once.

A :class:`TableSpec` names the file a stage writes into its run dir, its columns
and dtypes, and its key. ``write`` validates before anything touches disk and
``read`` validates what it loads, so column drift between the stage that writes
a table and the stages that read it fails loudly, naming the file and column.

Dtypes are pandas names: ``string``, ``int64``, ``Int64`` (nullable int),
``float64``, ``bool``. ``families`` admits families of columns whose names depend
on the dataset (:data:`saleval.vocab.PROBS`, ``prob_<label name>`` in predictions),
each built and parsed by its :class:`saleval.vocab.ColumnFamily`.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa

from saleval.errors import UserError
from saleval.pipeline.records import run_record
from saleval.vocab import PROBS, ColumnFamily


class TableError(UserError, ValueError):
    """A table on disk or in memory does not match its declaration."""


@dataclass(frozen=True)
class TableSpec:
    name: str
    filename: str
    columns: Mapping[str, str]
    key: tuple[str, ...] = ()
    optional: Mapping[str, str] = field(default_factory=dict)
    families: tuple[ColumnFamily, ...] = ()
    doc: str = ""

    @property
    def fmt(self) -> str:
        return "parquet" if self.filename.endswith(".parquet") else "csv"

    def path(self, run_dir: str | Path) -> Path:
        return Path(run_dir) / self.filename

    # -- validation ---------------------------------------------------------------
    def validate(self, df: pd.DataFrame, where: str = "<memory>") -> pd.DataFrame:
        """Check and coerce ``df``; returns a frame with declared columns first."""
        missing = [c for c in self.columns if c not in df.columns]
        if missing:
            raise TableError(
                f"{where}: table '{self.name}' lacks column(s) {missing}; has {list(df.columns)}"
            )
        out = df.copy()
        typed = dict(self.columns)
        typed.update({c: t for c, t in self.optional.items() if c in out.columns})
        for col in out.columns:
            for family in self.families:
                if family.holds(col):
                    typed[col] = family.dtype
        for col, dtype in typed.items():
            try:
                out[col] = _coerce(out[col], dtype)
            except (TypeError, ValueError) as err:
                bad = _first_bad_row(out[col], dtype)
                raise TableError(
                    f"{where}: column '{col}' of table '{self.name}' is not {dtype}"
                    f"{'' if bad is None else f' (row {bad}: {out[col].iloc[bad]!r})'}: {err}"
                ) from err
        if self.key:
            dup = out.duplicated(list(self.key), keep=False)
            if dup.any():
                rows = list(out.index[dup][:5])
                raise TableError(
                    f"{where}: table '{self.name}' has duplicate keys {self.key} "
                    f"at rows {rows} (first {min(5, int(dup.sum()))} of {int(dup.sum())})"
                )
        declared = [c for c in self.columns] + [c for c in out.columns if c not in self.columns]
        return out[declared]

    # -- I/O ----------------------------------------------------------------------
    def write(self, df: pd.DataFrame, run_dir: str | Path) -> Path:
        """Validate, then write through a temporary file renamed into place: a write cut
        short (a full disk, a kill) leaves no half table under the table's name."""
        path = self.path(run_dir)
        checked = self.validate(df, where=str(path))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            if self.fmt == "parquet":
                checked.to_parquet(tmp, index=False)
            else:
                checked.to_csv(tmp, index=False)
            os.replace(tmp, path)
        except OSError as err:  # name the table (pyarrow's message does not) and the errno
            code = err.errno or (errno.ENOSPC if "No space left" in str(err) else errno.EIO)
            raise OSError(code, err.strerror or os.strerror(code), str(path)) from err
        finally:
            tmp.unlink(missing_ok=True)
        return path

    def read(self, run_dir_or_file: str | Path) -> pd.DataFrame:
        """Read and validate; a table its run dir's record lists with another checksum
        (:func:`saleval.pipeline.records.run_record.table_problem`) or a file that cannot be parsed
        is one :class:`TableError` naming the file."""
        path = Path(run_dir_or_file)
        if path.is_dir():
            path = self.path(path)
        if not path.is_file():
            raise TableError(f"{path}: table '{self.name}' not found")
        changed = run_record.table_problem(path)
        if changed:
            raise TableError(changed)
        try:
            if self.fmt == "parquet":
                df = pd.read_parquet(path)
            else:
                # string columns stay strings ('5' must not come back as '5.0', '007' as '7')
                strings = {
                    c: str for c, t in {**self.columns, **self.optional}.items() if t == "string"
                }
                df = pd.read_csv(path, keep_default_na=False, na_values=[""], dtype=strings)
        except (OSError, ValueError, pa.ArrowException) as err:  # truncated, corrupt, not a table
            reason = " ".join(str(err).split())[:200] or type(err).__name__
            raise TableError(
                f"{path}: table '{self.name}' cannot be read ({reason}): the file is damaged; "
                "rerun the run that wrote it"
            ) from err
        return self.validate(df, where=str(path))


def _coerce(s: pd.Series, dtype: str) -> pd.Series:
    if dtype == "string":
        return s.astype("string")
    if dtype == "bool":
        if s.dtype == bool:
            return s
        mapped = s.map(
            lambda v: (
                {"true": True, "false": False, "1": True, "0": False}.get(str(v).lower())
                if not isinstance(v, bool)
                else v
            )
        )
        if mapped.isna().any():
            raise ValueError("values other than true/false")
        return mapped.astype(bool)
    if dtype in ("int64", "Int64"):
        numeric = pd.to_numeric(s, errors="raise")
        if dtype == "int64" and numeric.isna().any():
            raise ValueError("missing values")
        if (numeric.dropna() % 1 != 0).any():
            raise ValueError("non-integer values")
        return numeric.astype(dtype)
    if dtype == "float64":
        return pd.to_numeric(s, errors="raise").astype("float64")
    raise TypeError(f"unknown dtype {dtype}")


def _first_bad_row(s: pd.Series, dtype: str) -> int | None:
    for i, v in enumerate(s.tolist()):
        try:
            _coerce(pd.Series([v]), dtype)
        except (TypeError, ValueError):
            return i
    return None


def table(
    filename: str,
    columns: str,
    *,
    key: str = "",
    optional: str = "",
    families: tuple[ColumnFamily, ...] = (),
    name: str | None = None,
    doc: str = "",
) -> TableSpec:
    """A :class:`TableSpec` from its file name and its columns as ``name:dtype`` words
    (a bare ``name`` is a ``string`` column), its key as column names; ``name`` is the
    file's stem unless given. One declaration a table, every one read the same way.

    >>> t = table("bundles.csv", "bundle_id position:int64 task_id", key="bundle_id position")
    >>> t.name, dict(t.columns), t.key
    ('bundles', {'bundle_id': 'string', 'position': 'int64', 'task_id': 'string'}, \
('bundle_id', 'position'))
    """

    def typed(words: str) -> dict[str, str]:
        return dict((w.partition(":")[0], w.partition(":")[2] or "string") for w in words.split())

    return TableSpec(
        name=name or filename.partition(".")[0],
        filename=filename,
        columns=typed(columns),
        key=tuple(key.split()),
        optional=typed(optional),
        families=families,
        doc=doc,
    )


# ---------------------------------------------------------------------------------
# The tables of docs/architecture.md. Keep this list the single place where columns are named.
# ---------------------------------------------------------------------------------

PREDICTIONS = table(
    "predictions.parquet",
    "sample_id text label:int64 pred:int64",
    key="sample_id",
    optional="split n_words:int64 truncated:bool",
    families=(PROBS,),
    doc=f"The explained model's prediction per sample; {PROBS.pattern} per class.",
)

ATTRIBUTIONS = table(
    "attributions.parquet",
    "sample_id method word_index:int64 word char_start:int64 char_end:int64 score:float64",
    key="sample_id method word_index",
    optional="target:int64",
    doc=(
        "Word-level saliency (docs/methods.md): one row per kept word (no punctuation-only words, no"
        " special tokens, nothing lost to truncation). word_index counts kept words in text order "
        "from 0; char spans index the sample's text. 'method' is the method configuration's unique "
        "name (variants carry their settings)."
    ),
)

TASKS = table(
    "tasks.csv",
    "task_id sample_id method k:int64 label:int64 display_text n_words_shown:int64",
    key="task_id",
    optional="n_words:int64 all_shown:bool is_gold:bool target gold_label:int64 pred:int64 shown_words",
    doc=(
        "One crowd task t_ijk (docs/study-design.md#tasks). 'label' is the correct answer: the gold "
        "label, or the model's prediction in a forward-prediction study. Gold (attention-check) "
        "items have is_gold=true and method 'gold'. shown_words lists the shown word positions "
        "(word_index of the attributions), space-separated."
    ),
)

BUNDLES = table(
    "bundles.csv",
    "bundle_id position:int64 task_id is_gold:bool",
    key="bundle_id position",
    doc="Which task sits at which position of which bundle.",
)

ANSWERS = table(
    "answers.csv",
    "worker_id task_id answer",
    optional="bundle_id position:Int64 started_at submitted_at duration_s:float64 simulated:bool",
    doc=(
        "The import format (docs/aggregation.md): one answer per row. answer is a label name, a "
        'label index or "I don\'t know"; times are ISO 8601 or duration_s is given.'
    ),
)

ANNOTATIONS = table(
    "annotations.parquet",
    "worker_id task_id sample_id method k:int64 answer_code:int64 label:int64",
    key="worker_id task_id",
    optional="bundle_id duration_s:float64 is_gold:bool",
    doc="Accepted answers (docs/aggregation.md): 0 = I don't know, c in 1..C = label c-1.",
)

AGGREGATED = table(
    "aggregated.csv",
    "sample_id method k:int64 correct:int64",
    key="sample_id method k",
    optional="label:int64 n_answers:Int64 pred:Int64 gold_label:Int64 frac_correct:float64",
    doc="A[i, j, k] of docs/aggregation.md: 1 when the crowd recognised the target label.",
)

REJECTS = table(
    "rejects.csv",
    "file row:Int64 field problem",
    doc="Every input row the import did not accept, with why. Row numbers are 1-based data rows.",
)

ACCURACY = table(
    "accuracy.csv",
    "method k:int64 accuracy:float64",
    key="method k",
    optional="ci_low:float64 ci_high:float64 rank:int64 n:int64",
    doc="p_jk of docs/scores.md#accuracy in percent, with bootstrap CIs.",
)

SCORES = table(
    "scores.csv",
    "method score:float64 rank:int64",
    key="method",
    optional="ci_low:float64 ci_high:float64 p_vs_random:float64 p_vs_random_holm:float64",
    doc="s_j of docs/scores.md#method-score in percent; ties share the best rank.",
)

FLIPS = table(
    "flips.csv",
    "method flips:int64 aids:int64",
    key="method",
    optional="always:int64 never:int64",
    doc="Flip analysis of docs/scores.md#flips per method.",
)

METRICS = table(
    "metrics.csv",
    "method metric k value:float64",
    key="method metric k",
    optional="n:int64 std:float64",
    doc=(
        "Automated metrics of docs/metrics.md, averaged over examples. k is the number of words "
        "(e.g. '5'), a fraction ('0.2'), or empty for metrics averaged over a grid."
    ),
)

METRICS_PER_EXAMPLE = table(
    "metrics_per_example.parquet",
    "sample_id method metric k value:float64",
    key="sample_id method metric k",
    doc="Per-example values behind metrics.csv, for the instance-level analysis.",
)

COMPARISON = table(
    "comparison.csv",
    "method human_score:float64 human_rank:int64",
    key="method",
    optional="simulated:bool",
    doc=(
        "Human score and every automated metric per method: '<metric>' value and '<metric>_rank' "
        "columns after the declared ones."
    ),
)

CORRELATIONS = table(
    "correlations.csv",
    "metric level statistic value:float64",
    optional=(
        "ci_low:float64 ci_high:float64 p_value:float64 n:int64 higher_is_better:bool simulated:bool"
    ),
    doc="Rank correlations (method level) and instance-level correlations with crowd accuracy.",
)

SHORTCUT_RESULTS = table(
    "shortcut_results.csv",
    "dataset shortcut method config precision:float64 mean_rank:float64 n:int64",
    key="dataset shortcut method config",
    optional=(
        "unit precision_ci_low:float64 precision_ci_high:float64 mean_rank_ci_low:float64 "
        "mean_rank_ci_high:float64 k:int64 seconds:float64"
    ),
    doc=(
        "Precision@k and mean rank of the planted shortcut tokens (docs/shortcut.md). 'method' is "
        "the method family, 'config' the configuration's unique name; unit = what was ranked (word |"
        " piece); *_ci_low/high = 95 % intervals (Wilson for precision, t for mean rank); k = number"
        " of shortcut tokens; seconds = attribution wall time over the n examples."
    ),
)

REPORT = table(
    "report.csv",
    "dataset model variant method human_score:float64 human_rank:Int64",
    key="dataset model variant method",
    optional="simulated:bool runs",
    doc=(
        "saleval-report: one row per dataset × model × variant × method gathered from score, metrics"
        " and compare runs; '<metric>' value and '<metric>_rank' columns (ranks within each dataset "
        "and model, 1 = best) follow the declared ones. variant: the sweep overrides that set the "
        "run apart ('' when none); runs: the run dirs of the row."
    ),
)

REPORT_CORRELATIONS = table(
    "report_correlations.csv",
    "dataset model variant metric statistic value:float64",
    optional="p_value:float64 n:int64 higher_is_better:bool simulated:bool",
    doc=(
        "saleval-report: Spearman/Kendall agreement of each metric's method ranking with the human "
        "ranking, per group of the report's rank_within (model/variant '' when the group spans "
        "them)."
    ),
)

REPORT_RUNS = table(
    "report_runs.csv",
    "run_dir stage run_id dataset model variant",
    key="run_dir",
    optional="simulated:bool",
    doc="saleval-report: every run it gathered, with what it is about.",
)

PLAN = table(
    "plan.csv",
    (
        "design:int64 source n:int64 repeats:int64 n_methods:int64 n_ks:int64 tasks:int64 "
        "answers:int64 bundles:int64 worker_minutes:float64 cost:float64 p_best:float64 "
        "spearman_mean:float64 ci_width_mean:float64 meets_target:bool"
    ),
    key="design",
    optional=(
        "methods ks spearman_p05:float64 ci_width_max:float64 p_order_min:float64 power_min:float64"
    ),
    doc=(
        "One row per design of saleval-plan (docs/planning.md): its size and cost, and what studies "
        "of it drawn from the source show: p_best = P(top method = the reference's), "
        "spearman_mean/_p05 = Spearman's rho with the reference ranking (mean, 5th percentile), "
        "ci_width_* = width of the 95 % interval of s_j in points, p_order_min = the least reliably "
        "ordered adjacent pair, power_min = the least power against the baseline; cost in "
        "plan.cost.currency."
    ),
)

PLAN_METHODS = table(
    "plan_methods.csv",
    (
        "design:int64 method reference_score:float64 reference_rank:int64 mean_score:float64 "
        "ci_width:float64"
    ),
    key="design method",
    optional="p_order_next:float64 power:float64",
    doc=(
        "Per design and method (docs/planning.md): the reference score and rank, the mean score over"
        " drawn studies, the width of its 95 % interval, the probability of being ordered above the "
        "next method of the reference ranking, and the power of the paired test against the "
        "baseline."
    ),
)

PLAN_CHECK = table(
    "half_sample_check.csv",
    "row n:int64 sampling p_best:float64 spearman_mean:float64 ci_width_mean:float64",
    key="row",
    optional="spearman_p05:float64 p_order_min:float64 ci_width_max:float64",
    name="plan_check",
    doc=(
        "saleval-plan's check against the published study (docs/planning.md#check): the empirical "
        "prediction for n = N/2, the same at n = N (what half-samples of the pool should resemble "
        "once the finite-population correction is applied), and what half-samples drawn without "
        "replacement actually show."
    ),
)


ALL: dict[str, TableSpec] = {
    t.name: t
    for t in (
        PREDICTIONS,
        ATTRIBUTIONS,
        TASKS,
        BUNDLES,
        ANSWERS,
        ANNOTATIONS,
        AGGREGATED,
        REJECTS,
        ACCURACY,
        SCORES,
        FLIPS,
        METRICS,
        METRICS_PER_EXAMPLE,
        COMPARISON,
        CORRELATIONS,
        SHORTCUT_RESULTS,
        REPORT,
        REPORT_CORRELATIONS,
        REPORT_RUNS,
        PLAN,
        PLAN_METHODS,
        PLAN_CHECK,
    )
}


#: the import stage's report (hashes, counts, filters, agreement); JSON, read by score
IMPORT_REPORT = "import_report.json"
