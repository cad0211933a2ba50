"""Fine-tuning with PyTorch Lightning (docs/data-and-models.md): data module, module, trainer.

Lightning owns the loop, devices, precision and early stopping so that the same
code trains on this laptop CPU and on several GPUs (``trainer.devices``,
``trainer.strategy``). Batches are padded dynamically, and every batch is sorted
into length buckets at evaluation time, because padding is the main waste on CPU.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import mlflow
import numpy as np
import pandas as pd
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint, TQDMProgressBar
from torch.utils.data import DataLoader
from transformers import PreTrainedModel, PreTrainedTokenizerFast
from transformers.optimization import get_linear_schedule_with_warmup

from saleval import progress
from saleval.config.trainer import LoaderConfig, TrainerConfig
from saleval.modeling.devices import device_for
from saleval.modeling.interface import ModelInterface, basic_interface
from saleval.schema import to_schema


class TokenizedTexts(torch.utils.data.Dataset):
    def __init__(self, df: pd.DataFrame, tokenizer: PreTrainedTokenizerFast, max_length: int):
        enc = tokenizer(df["text"].tolist(), truncation=True, max_length=max_length)
        self.items = [
            {"input_ids": ids, "labels": int(y)}
            for ids, y in zip(enc["input_ids"], df["label"].tolist())
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.items[i]


class Collate:
    """A batch of :class:`TokenizedTexts` items as the model takes it: right-padded with the
    model's own pad id and fed as its tokenizer feeds it
    (:class:`saleval.modeling.interface.ModelInterface`), the same way every later stage
    feeds the model, plus ``labels``."""

    def __init__(self, interface: ModelInterface) -> None:
        self.interface = interface

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        ids, mask = self.interface.pad([it["input_ids"] for it in items])
        labels = torch.as_tensor([int(it["labels"]) for it in items], dtype=torch.long)
        return {**self.interface.inputs(ids, mask), "labels": labels}


def length_sorted_indices(ds: TokenizedTexts) -> list[int]:
    return sorted(range(len(ds)), key=lambda i: len(ds.items[i]["input_ids"]))


class LengthGroupedBatches(torch.utils.data.Sampler[list[int]]):
    """Training batches of similar length, in random order (``trainer.loader.length_grouped``,
    the default).

    Each epoch the examples are shuffled, cut into pools of ``pool`` batches, each pool is
    sorted by length and cut into batches, and the batches are shuffled: every batch
    still draws from a random stretch of the data, but pads to a near neighbour's length
    rather than to the longest of ``batch_size`` random texts (the grouping of Hugging
    Face's ``group_by_length``; its saving is measured in docs/benchmarks.md). Under
    data parallelism each of ``replicas`` processes takes every ``replicas``-th batch of
    the same seeded order, from ``rank`` on, all of them the same number (the last
    batches are repeated where the count does not divide, as a distributed sampler pads).

    >>> b = LengthGroupedBatches([5, 1, 4, 2, 3, 6], batch_size=2, pool=3, seed=0)
    >>> sorted(i for batch in b for i in batch), len(b)
    ([0, 1, 2, 3, 4, 5], 3)
    >>> ranks = [LengthGroupedBatches([5, 1, 4, 2, 3, 6], 2, 3, 0, r, 2) for r in (0, 1)]
    >>> [len(list(r)) for r in ranks], sorted({i for r in ranks for bt in r for i in bt})
    ([2, 2], [0, 1, 2, 3, 4, 5])
    """

    def __init__(
        self,
        lengths: list[int],
        batch_size: int,
        pool: int = 50,
        seed: int = 0,
        rank: int = 0,
        replicas: int = 1,
    ):
        self.lengths = list(lengths)
        self.batch_size = int(batch_size)
        self.pool = int(pool)
        self.seed = int(seed)
        self.rank, self.replicas = int(rank), int(replicas)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Lightning calls this before each epoch: another shuffle per epoch."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return math.ceil(math.ceil(len(self.lengths) / self.batch_size) / self.replicas)

    def __iter__(self) -> Iterator[list[int]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        order = rng.permutation(len(self.lengths))
        size = self.batch_size * self.pool
        batches: list[list[int]] = []
        for start in range(0, len(order), size):
            pool = sorted(order[start : start + size].tolist(), key=lambda i: self.lengths[i])
            batches += [pool[j : j + self.batch_size] for j in range(0, len(pool), self.batch_size)]
        shuffled = [batches[k] for k in rng.permutation(len(batches))]
        total = len(self) * self.replicas
        shuffled += shuffled[: total - len(shuffled)]  # equal shares for every process
        yield from shuffled[self.rank : total : self.replicas]


class TextDataModule(L.LightningDataModule):
    """Train/validation/test splits of a :class:`saleval.modeling.data.DatasetSplits`.

    The loader settings have no defaults here: they are ``trainer.loader``'s
    (:class:`saleval.config.trainer.LoaderConfig`, through :meth:`from_config`)."""

    def __init__(
        self,
        splits: Mapping[str, pd.DataFrame],
        tokenizer: PreTrainedTokenizerFast,
        *,
        max_length: int,
        batch_size: int,
        eval_batch_size: int,
        num_workers: int,
        length_grouped: bool,
        seed: int = 0,
        interface: ModelInterface | None = None,
    ) -> None:
        super().__init__()
        self.length_grouped = length_grouped
        self.seed = seed
        self.splits = splits
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.num_workers = num_workers
        # without the model: what the tokenizer produces, padded with its pad id
        self.collate = Collate(interface or basic_interface(tokenizer))
        self.ds: dict[str, TokenizedTexts] = {}

    @classmethod
    def from_config(
        cls,
        splits: Mapping[str, pd.DataFrame],
        tokenizer: PreTrainedTokenizerFast,
        max_length: int,
        loader: LoaderConfig | Mapping[str, Any] | Any,
        seed: int = 0,
        interface: ModelInterface | None = None,
    ) -> TextDataModule:
        """The data module with the batch sizes and workers of ``trainer.loader``; batches
        are fed as ``interface`` says (the model's, from
        :func:`saleval.modeling.interface.interface`)."""
        lc = to_schema(LoaderConfig, loader)
        return cls(
            splits,
            tokenizer,
            max_length=max_length,
            batch_size=lc.batch_size,
            eval_batch_size=lc.eval_batch_size,
            num_workers=lc.num_workers,
            length_grouped=lc.length_grouped,
            seed=seed,
            interface=interface,
        )

    def setup(self, stage: str | None = None) -> None:
        for name, df in self.splits.items():
            if name not in self.ds:
                self.ds[name] = TokenizedTexts(df, self.tokenizer, self.max_length)

    def train_dataloader(self) -> DataLoader:
        if self.length_grouped:
            ds = self.ds["train"]
            lengths = [len(item["input_ids"]) for item in ds.items]
            trainer = getattr(self, "trainer", None)  # None outside a Trainer (benchmarks)
            rank, replicas = (trainer.global_rank, trainer.world_size) if trainer else (0, 1)
            return DataLoader(
                ds,
                batch_sampler=LengthGroupedBatches(
                    lengths, self.batch_size, seed=self.seed, rank=rank, replicas=replicas
                ),
                collate_fn=self.collate,
                num_workers=self.num_workers,
            )
        return DataLoader(
            self.ds["train"],
            batch_size=self.batch_size,
            shuffle=True,
            collate_fn=self.collate,
            num_workers=self.num_workers,
        )

    def _eval(self, name: str) -> DataLoader:
        ds = self.ds[name]
        subset = torch.utils.data.Subset(ds, length_sorted_indices(ds))
        return DataLoader(
            subset,
            batch_size=self.eval_batch_size,
            shuffle=False,
            collate_fn=self.collate,
            num_workers=self.num_workers,
        )

    def val_dataloader(self) -> DataLoader:
        return self._eval("validation")

    def test_dataloader(self) -> DataLoader:
        return self._eval("test")


class SequenceClassifier(L.LightningModule):
    """AdamW fine-tuning of a Hugging Face sequence classifier; the optimiser's settings
    are ``trainer.optimizer``'s (:class:`saleval.config.trainer.OptimizerConfig`, given by
    :func:`fit`), with no second set of defaults here."""

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        lr: float,
        weight_decay: float,
        warmup_ratio: float,
        scheduler: str,
    ) -> None:
        super().__init__()
        self.model = model
        self.lr = lr
        self.weight_decay = weight_decay
        self.warmup_ratio = warmup_ratio
        self.scheduler = scheduler
        self._correct = 0
        self._count = 0

    def forward(self, **batch: torch.Tensor) -> Any:
        return self.model(**batch)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        out = self.model(**batch)
        self.log(
            "train_loss",
            out.loss,
            prog_bar=True,
            on_step=True,
            on_epoch=True,
            batch_size=batch["labels"].shape[0],
        )
        return out.loss

    def _eval_step(self, batch: dict[str, torch.Tensor], prefix: str) -> None:
        out = self.model(**batch)
        acc = (out.logits.argmax(-1) == batch["labels"]).float().mean()
        n = batch["labels"].shape[0]
        self.log(f"{prefix}_loss", out.loss, on_epoch=True, batch_size=n, sync_dist=True)
        self.log(f"{prefix}_acc", acc, on_epoch=True, prog_bar=True, batch_size=n, sync_dist=True)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def configure_optimizers(self) -> Any:
        no_decay = ("bias", "LayerNorm.weight", "LayerNorm.bias")
        groups = [
            {
                "params": [p for n, p in self.model.named_parameters() if not n.endswith(no_decay)],
                "weight_decay": self.weight_decay,
            },
            {
                "params": [p for n, p in self.model.named_parameters() if n.endswith(no_decay)],
                "weight_decay": 0.0,
            },
        ]
        opt = torch.optim.AdamW(groups, lr=self.lr)
        if self.scheduler == "constant":
            return opt
        total = int(self.trainer.estimated_stepping_batches)
        sched = get_linear_schedule_with_warmup(opt, math.ceil(self.warmup_ratio * total), total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class MlflowEpochLogger(Callback):
    """Per-epoch metrics into the active MLflow run (the stage's run), stepped by epoch,
    under the project's key names (``docs/tracking.md``): Lightning's ``val_acc`` is
    ``val_accuracy``, the epoch mean ``train_loss_epoch`` is ``train_loss``. The keys are
    fixed here, already in the one key style, so nothing of :mod:`saleval.pipeline` (a
    layer above) is needed to log them."""

    #: Lightning's name of a logged value → its MLflow key
    KEYS: ClassVar[dict[str, str]] = {
        "val_acc": "val_accuracy",
        "val_loss": "val_loss",
        "train_loss_epoch": "train_loss",
    }

    def __init__(self, log: Callable[[Mapping[str, float], int], None] | None = None) -> None:
        self.t0 = time.perf_counter()
        self.log_values = log

    def _log(self, trainer: L.Trainer) -> None:
        if trainer.global_rank != 0 or mlflow.active_run() is None:
            return
        vals = self.values(trainer)
        vals["elapsed_seconds"] = time.perf_counter() - self.t0
        if self.log_values is not None:  # the stage's: journaled, an outage costs no epoch
            self.log_values(vals, trainer.current_epoch)
        else:
            mlflow.log_metrics(vals, step=trainer.current_epoch)

    @classmethod
    def values(cls, trainer: L.Trainer) -> dict[str, float]:
        """The epoch's logged values under the project's keys."""
        return {cls.KEYS[k]: float(v) for k, v in trainer.callback_metrics.items() if k in cls.KEYS}

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning runs the epoch's validation before this hook: both are available.
        self._log(trainer)


class EpochLines(Callback):
    """One plain log line per epoch where stderr is not a terminal (a job's log), in place
    of Lightning's bar, whose redraws a file would keep (:mod:`saleval.progress`)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_rank == 0:
            vals = ", ".join(
                f"{k} {v:.4f}" for k, v in sorted(MlflowEpochLogger.values(trainer).items())
            )
            total = trainer.max_epochs if (trainer.max_epochs or 0) > 0 else None
            desc, seconds = f"epoch ({vals})" if vals else "epoch", time.perf_counter() - self.t0
            progress.log.info(progress.line(desc, trainer.current_epoch + 1, total, seconds))


def trainer_config(cfg: TrainerConfig | Mapping[str, Any] | Any) -> TrainerConfig:
    """A ``conf/trainer`` node as the typed :class:`TrainerConfig` (unknown keys fail).

    >>> trainer_config({"max_epochs": 2, "optimizer": {"lr": 1e-3}}).optimizer.lr
    0.001
    """
    return to_schema(TrainerConfig, cfg)


#: batch limits where 0 keeps Lightning's meaning: ``limit_train_batches=0`` trains on
#: nothing, so a train run evaluates (and saves) its starting checkpoint as it is
ZERO_MEANS_NONE = ("limit_train_batches",)


def _positive_or_all(value: Any, key: str) -> Any:
    """A Lightning batch limit from the config: null means every batch (1.0), an int that
    many batches, a float that fraction. 0 passes for the keys in ``ZERO_MEANS_NONE`` and
    fails elsewhere (``val_check_interval=0`` would never validate).

    >>> _positive_or_all(None, "limit_train_batches"), _positive_or_all(0, "limit_train_batches")
    (1.0, 0)
    """
    if value is None:
        return 1.0
    zero_ok = key in ZERO_MEANS_NONE
    if float(value) < 0 or (float(value) == 0 and not zero_ok):
        raise ValueError(
            f"trainer.{key}={value}: must be {'>= 0' if zero_ok else '> 0'} (an int: batches, "
            "a float: a fraction; null: every batch)"
        )
    return value


def resolve_precision(precision: str, device: torch.device) -> str:
    """``trainer.precision``: ``auto`` is ``bf16-mixed`` where the training ``device`` has
    native bf16 and ``32-true`` elsewhere (saleval.modeling.inference.bf16_native: emulated
    bf16 trains ~8× slower); any other value is Lightning's own.

    >>> cpu = torch.device("cpu")
    >>> resolve_precision("32-true", cpu), resolve_precision("bf16-mixed", cpu)
    ('32-true', 'bf16-mixed')
    >>> resolve_precision("auto", cpu) in ("bf16-mixed", "32-true")
    True
    """
    if precision != "auto":
        return precision
    from saleval.modeling.inference import bf16_native

    return "bf16-mixed" if bf16_native(device) else "32-true"


def fit(
    model: PreTrainedModel,
    data: TextDataModule,
    trainer_cfg: TrainerConfig | Mapping[str, Any] | Any,
    workdir: Path,
    log_metrics: Callable[[Mapping[str, float], int], None] | None = None,
) -> dict[str, float]:
    """Fit with early stopping on validation accuracy, restore the best epoch, test it.

    ``log_metrics(values, epoch)``: where the per-epoch metrics go (the stage passes its
    own, which keeps them in the run dir's journal when the tracking store is down);
    None logs them to the active MLflow run directly."""
    tc = trainer_config(trainer_cfg)
    # a GPU asked for where there is none: one line here, not Lightning's traceback later
    precision = resolve_precision(tc.precision, device_for(tc.accelerator))
    ckpt_dir = workdir / "checkpoints"
    checkpoint = ModelCheckpoint(
        dirpath=ckpt_dir,
        monitor="val_acc",
        mode="max",
        save_top_k=1,
        save_weights_only=True,
        filename="best",
    )
    callbacks: list[Callback] = [
        checkpoint,
        EarlyStopping(monitor="val_acc", mode="max", patience=tc.early_stopping.patience),
        MlflowEpochLogger(log_metrics),
    ]
    bar = tc.progress_bar and progress.interactive()  # a file gets one line per epoch
    if bar:
        callbacks.append(TQDMProgressBar(refresh_rate=tc.progress_refresh))
    elif tc.progress_bar:
        callbacks.append(EpochLines())
    opt = tc.optimizer
    module = SequenceClassifier(
        model,
        lr=float(opt.lr),
        weight_decay=float(opt.weight_decay),
        warmup_ratio=float(opt.warmup_ratio),
        scheduler=str(opt.scheduler),
    )
    trainer = L.Trainer(
        accelerator=tc.accelerator,
        devices=tc.devices,
        num_nodes=tc.num_nodes,
        strategy=tc.strategy,
        precision=precision,  # type: ignore[arg-type]
        max_epochs=tc.max_epochs,
        min_epochs=tc.min_epochs,
        limit_train_batches=_positive_or_all(tc.limit_train_batches, "limit_train_batches"),
        val_check_interval=_positive_or_all(tc.val_check_interval, "val_check_interval"),
        gradient_clip_val=tc.gradient_clip_val,
        deterministic=tc.deterministic,
        callbacks=callbacks,
        logger=False,
        default_root_dir=str(workdir),
        enable_model_summary=False,
        num_sanity_val_steps=0,
        enable_progress_bar=bar,
        # length-grouped batches shard themselves across processes (LengthGroupedBatches)
        use_distributed_sampler=not data.length_grouped,
    )
    # from_pretrained returns eval mode and Lightning keeps submodule modes: turn dropout on.
    module.train()
    trainer.fit(module, datamodule=data)
    if checkpoint.best_model_path:
        state = torch.load(checkpoint.best_model_path, map_location="cpu", weights_only=True)
        module.load_state_dict(state["state_dict"])
    if checkpoint.best_model_score is not None:
        best_val = float(checkpoint.best_model_score)
    else:  # nothing validated (limit_train_batches=0, max_epochs=0): the model as it is
        checked = trainer.validate(module, datamodule=data, verbose=False)
        best_val = float(checked[0].get("val_acc", float("nan"))) if checked else float("nan")
    test = trainer.test(module, datamodule=data, verbose=False)[0]
    # Under DDP every rank loaded rank 0's checkpoint before the test's collectives; only
    # rank 0 deletes it (several ranks unlinking one file would race).
    if trainer.is_global_zero:
        for f in ckpt_dir.glob("*.ckpt"):
            f.unlink(missing_ok=True)
        if ckpt_dir.is_dir() and not any(ckpt_dir.iterdir()):
            ckpt_dir.rmdir()
    return {
        "val_accuracy": best_val,
        "test_accuracy": float(test["test_acc"]),
        "test_loss": float(test["test_loss"]),
        "epochs": int(trainer.current_epoch),
        "steps": int(trainer.global_step),
        "bf16_training": float(precision.startswith("bf16")),  # what precision=auto chose
    }
