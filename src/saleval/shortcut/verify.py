"""Verification that the mixed model uses the shortcut (docs/shortcut.md#models-and-verification).

Precision@k against a planted ground truth only measures faithfulness if the
explained model really relies on the shortcut. So before any saliency is computed:

* the mixed model must classify the fully synthetic test set almost perfectly
  (≥ ``mixed_synthetic_min``, 0.99): it follows the rule;
* the original model must sit at chance on it (within ``original_synthetic_band``,
  0.10): the synthetic labels are not predictable from the text itself, so the
  mixed model's success can only come from the tokens;
* both must score alike on the original test set (within ``original_test_gap``):
  the shortcut did not replace the task.

Any failed check raises :class:`VerificationError` carrying every number.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from saleval.errors import UserError
from saleval.modeling.inference import predict_proba

DEFAULT_THRESHOLDS = {
    "mixed_synthetic_min": 0.99,
    "original_synthetic_band": 0.10,
    "original_test_gap": 0.03,
}


@dataclass
class VerificationReport:
    """The four accuracies, the thresholds, and which checks passed."""

    mixed_synthetic: float
    original_synthetic: float
    mixed_test: float
    original_test: float
    chance: float
    n_synthetic: int
    n_test: int
    thresholds: dict[str, float]
    checks: dict[str, bool] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(self.checks.values())

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}

    def failures(self) -> list[str]:
        t = self.thresholds
        why = {
            "mixed_learned_shortcut": (
                f"mixed model accuracy on the synthetic test set {self.mixed_synthetic:.4f} "
                f"< {t['mixed_synthetic_min']}"
            ),
            "original_at_chance": (
                f"original model accuracy on the synthetic test set {self.original_synthetic:.4f} "
                f"is not within chance {self.chance:.4f} ± {t['original_synthetic_band']}"
            ),
            "same_task_accuracy": (
                f"original-test accuracy differs by "
                f"{abs(self.mixed_test - self.original_test):.4f} > {t['original_test_gap']} "
                f"(original model {self.original_test:.4f}, mixed model {self.mixed_test:.4f})"
            ),
        }
        return [why[name] for name, ok in self.checks.items() if not ok]


class VerificationError(UserError, RuntimeError):
    """The mixed model does not (only) use the shortcut: saliency would measure nothing."""

    def __init__(self, report: VerificationReport) -> None:
        self.report = report
        problems = "; ".join(report.failures())
        super().__init__(
            f"shortcut verification failed, no saliency computed: {problems}. "
            f"Numbers: {report.to_dict()}"
        )


def chance_accuracy(labels: Sequence[int] | np.ndarray) -> float:
    """Accuracy of always answering the most frequent label (0.5 on a balanced binary set)."""
    y = np.asarray(labels)
    if y.size == 0:
        raise ValueError("no labels")
    return float(np.bincount(y).max() / y.size)


def verify(
    mixed_synthetic: float,
    original_synthetic: float,
    mixed_test: float,
    original_test: float,
    chance: float,
    n_synthetic: int,
    n_test: int,
    thresholds: Mapping[str, float] | None = None,
) -> VerificationReport:
    """Apply the three checks of the module docstring to measured accuracies."""
    t = {**DEFAULT_THRESHOLDS, **{k: float(v) for k, v in (thresholds or {}).items()}}
    unknown = set(t) - set(DEFAULT_THRESHOLDS)
    if unknown:
        raise ValueError(f"unknown verification thresholds {sorted(unknown)}")
    report = VerificationReport(
        mixed_synthetic=float(mixed_synthetic),
        original_synthetic=float(original_synthetic),
        mixed_test=float(mixed_test),
        original_test=float(original_test),
        chance=float(chance),
        n_synthetic=int(n_synthetic),
        n_test=int(n_test),
        thresholds=t,
    )
    eps = 1e-9  # accuracies are ratios of counts: compare without float noise
    report.checks = {
        "mixed_learned_shortcut": mixed_synthetic >= t["mixed_synthetic_min"] - eps,
        "original_at_chance": abs(original_synthetic - chance)
        <= t["original_synthetic_band"] + eps,
        "same_task_accuracy": abs(mixed_test - original_test) <= t["original_test_gap"] + eps,
    }
    return report


def require(report: VerificationReport) -> VerificationReport:
    """Raise :class:`VerificationError` unless every check passed."""
    if not report.passed:
        raise VerificationError(report)
    return report


def accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    df: pd.DataFrame,
    max_length: int,
    **kwargs: Any,
) -> tuple[float, np.ndarray]:
    """Accuracy on ``df`` (text, label) and the predicted labels, batched by length."""
    ids = tokenizer(df["text"].tolist(), truncation=True, max_length=max_length)["input_ids"]
    was_training = model.training
    model.eval()
    try:
        proba = predict_proba(model, ids, tokenizer=tokenizer, **kwargs)
    finally:
        model.train(was_training)
    pred = proba.argmax(axis=1)
    return float((pred == df["label"].to_numpy()).mean()), pred
