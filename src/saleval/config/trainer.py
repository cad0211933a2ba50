"""Schema of ``conf/trainer``: Lightning Trainer arguments, with the optimiser, the data
loaders and early stopping nested by concern (the BERT fine-tuning recipe of Lu et al. 2024: AdamW, lr 2e-5, batch 16)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Scheduler(StrEnum):
    """``linear``: warm-up then linear decay; ``constant``: the optimiser's lr throughout."""

    linear = "linear"
    constant = "constant"


@dataclass
class OptimizerConfig:
    """AdamW (weight decay off for biases and LayerNorm) and its learning-rate schedule."""

    lr: float = 2.0e-5
    weight_decay: float = 0.01
    scheduler: Scheduler = Scheduler.linear
    warmup_ratio: float = 0.06  # share of the steps spent warming up


@dataclass
class LoaderConfig:
    """Data loaders: training batches and (length-bucketed) evaluation batches."""

    batch_size: int = 16
    eval_batch_size: int = 64
    num_workers: int = 0
    # training batches of similar length (saleval.modeling.training.LengthGroupedBatches):
    # 36 % → 4 % padding on AG News (docs/benchmarks.md#training-defaults); false: the
    # plain shuffle of earlier versions (another batch order, hence another model)
    length_grouped: bool = True


@dataclass
class EarlyStoppingConfig:
    """Early stopping on validation accuracy (the best epoch is restored)."""

    patience: int = 1


@dataclass
class TrainerConfig:
    """``conf/trainer/*.yaml``. Top-level keys are ``lightning.Trainer`` arguments.

    ``devices``, ``limit_train_batches`` and ``val_check_interval`` take an int or a
    float/string as Lightning does (``1`` is one batch, ``1.0`` all of them), hence ``Any``.
    """

    accelerator: str = "auto"
    devices: Any = "auto"
    num_nodes: int = 1
    strategy: str = "auto"
    # auto: bf16-mixed where the training device computes bf16 natively (a GPU with bf16,
    # an AVX512-BF16/AMX CPU), 32-true elsewhere (emulated bf16 is ~8× slower);
    # or any Lightning precision ("32-true" for the defaults of earlier versions)
    precision: str = "auto"
    max_epochs: int = 3
    min_epochs: int = 1
    gradient_clip_val: float | None = 1.0
    limit_train_batches: Any = None  # null: every batch
    val_check_interval: Any = None  # null: once per epoch
    deterministic: bool = False
    progress_bar: bool = True
    progress_refresh: int = 10
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
