"""``saleval-train``: fine-tune a BERT classifier on a dataset (docs/data-and-models.md#training,
docs/architecture.md).

Writes ``model/`` (save_pretrained: weights + tokenizer) and ``metrics.json``
(``val_accuracy``, ``test_accuracy``, ``n_train``, ``seconds``) into the run dir; logs
the three splits as the run's inputs and (``tracking.log_model``, on by default) the
classifier as an MLflow model (``docs/tracking.md``). Under
``trainer=ddp`` Lightning re-runs this script for ranks > 0; only rank 0 writes and logs.

Reads no run: the splits of ``dataset`` (``dataset.max_train``, ``dataset.max_validation``,
``dataset.max_test`` cap them).

Main options: ``dataset`` (ag_news, imdb, sst2, ...), ``model`` (bert_base, minilm, tiny),
``trainer`` (default, cpu, gpu, ddp), ``trainer.max_epochs``, ``seed``.

Example::

    saleval-train dataset=imdb model=bert_base trainer=gpu
"""

from __future__ import annotations

import logging
import time
from typing import Any

from omegaconf import DictConfig, open_dict

from saleval.config.model import is_prompted
from saleval.modeling.data import load_dataset
from saleval.pipeline.records.jsonfiles import write_json
from saleval.pipeline.stage import Stage
from saleval.pipeline.tracker import tracking_models

log = logging.getLogger(__name__)


def mlflow_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The train run's summary metrics. ``val_accuracy`` of ``metrics.json`` (the best
    epoch's, whose weights are kept) is ``best_val_accuracy`` here: the key
    ``val_accuracy`` is the per-epoch series (:class:`saleval.modeling.training.MlflowEpochLogger`).
    ``seconds`` is left out: the stage's ``stage_seconds`` says it.

    >>> mlflow_metrics({"val_accuracy": 0.5, "test_accuracy": 0.4, "seconds": 3.0, "x": "y"})
    {'best_val_accuracy': 0.5, 'test_accuracy': 0.4}
    """
    renamed = {"val_accuracy": "best_val_accuracy"}
    return {
        renamed.get(k, k): float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and k != "seconds"
    }


def run_prompted(cfg: DictConfig) -> dict[str, Any]:
    """``model=prompted``: nothing is fine-tuned. The prompt is fixed (the few-shot
    examples drawn from the training split), written to ``model/`` as the classifier every
    later stage loads, and its validation and test accuracy recorded as a trained model's
    are (docs/data-and-models.md#prompted-llms)."""
    import torch

    from saleval.modeling import prompted, prompts
    from saleval.modeling.devices import device_for, single_device
    from saleval.modeling.inference import forward_logits
    from saleval.modeling.interface import effective_max_length, model_tags
    from saleval.modeling.models import MODEL_DIR, checkpoint_name

    if not cfg.model.get("pretrained"):
        raise prompts.PromptError(
            "model=prompted needs model.pretrained: the directory (or hub id) of a causal LM"
        )
    if cfg.model.name == "prompted":  # the run's model is the LM it prompts
        with open_dict(cfg):
            cfg.model.name = f"{checkpoint_name(str(cfg.model.pretrained))}-prompted"
    with Stage(cfg, "train") as st:
        t0 = time.perf_counter()
        data = load_dataset(cfg.dataset)
        model, tok, spec = prompted.build(
            cfg.model, str(cfg.model.pretrained), data.label_names, data["train"]
        )
        max_length = effective_max_length(int(cfg.model.max_length), model, tok)
        st.provide(max_length=max_length)
        st.tracking.set_tags({**model_tags(model, tok), **prompts.describe(spec)})
        if single_device(cfg.trainer):
            torch.nn.Module.to(model, device_for(cfg.trainer.accelerator))
        accuracy = {}
        for split, key in (("validation", "val_accuracy"), ("test", "test_accuracy")):
            df = data[split]
            ids = tok(df["text"].astype(str).tolist(), truncation=True, max_length=max_length)
            logits = forward_logits(
                model, ids["input_ids"], tokenizer=tok, progress=False, desc=f"{split} accuracy"
            )
            accuracy[key] = float((logits.argmax(1) == df["label"].to_numpy()).mean())
            log.info("prompted %s: %s accuracy %.3f", cfg.model.name, split, accuracy[key])
        if not st.is_main:
            return {"run_dir": str(st.run_dir), "run_id": None, **accuracy}
        prompt_file = spec.save(st.path(MODEL_DIR))
        metrics = {
            **accuracy,
            "n_train": len(data["train"]),
            "n_validation": len(data["validation"]),
            "n_test": len(data["test"]),
            "n_shots": len(spec.shots),
            "seconds": time.perf_counter() - t0,
            "data_source": data.source,
            **({"max_length": max_length} if max_length != int(cfg.model.max_length) else {}),
            **({"pad_token": f"{spec.pad_token} (the eos token)"} if spec.pad_token else {}),
        }
        write_json(st.path("metrics.json"), metrics)
        for split in ("train", "validation", "test"):
            tracking_models.log_dataset(data[split], f"{data.name}/{split}", split, targets="label")
        st.log_metrics(mlflow_metrics(metrics))
        st.log_file(st.path("metrics.json"))
        st.log_file(prompt_file, MODEL_DIR)
        return {
            "run_dir": str(st.run_dir),
            "run_id": st.tracking.run_id,
            **metrics,
            "objective": metrics["val_accuracy"],
        }


def run(cfg: DictConfig) -> dict[str, Any]:
    if is_prompted(cfg.model):
        return run_prompted(cfg)
    # torch, transformers (and Lightning) load when a run starts, not on import (saleval.cli)
    import lightning as L

    from saleval.modeling.interface import effective_max_length, interface, model_tags
    from saleval.modeling.models import (
        MODEL_DIR,
        build_model,
        load_tokenizer,
        use_checkpoint,
    )
    from saleval.modeling.padding import prepare_for_training
    from saleval.modeling.training import TextDataModule, fit

    with open_dict(cfg):  # model.pretrained=<dir> trains <dir>, whatever the model group
        note = use_checkpoint(cfg.model)
    if note:
        log.info(note)
    with Stage(cfg, "train") as st:
        t0 = time.perf_counter()
        L.seed_everything(int(cfg.seed), workers=True)
        data = load_dataset(cfg.dataset)
        tokenizer = load_tokenizer(cfg.model)
        model = build_model(cfg.model, data.label_names, seed=int(cfg.seed))
        set_up = prepare_for_training(model, tokenizer)
        # the checkpoint's position limit caps model.max_length
        max_length = effective_max_length(int(cfg.model.max_length), model, tokenizer)
        st.provide(max_length=max_length)
        st.tracking.set_tags(model_tags(model, tokenizer))
        dm = TextDataModule.from_config(
            {s: data[s] for s in ("train", "validation", "test")},
            tokenizer,
            max_length,
            cfg.trainer.loader,
            seed=int(cfg.seed),
            interface=interface(model, tokenizer),
        )
        result = fit(model, dm, cfg.trainer, st.run_dir, log_metrics=st.log_metrics)
        if not st.is_main:  # a DDP rank > 0 (trainer=ddp): rank 0 saves and logs the model
            return {"run_dir": str(st.run_dir), "run_id": None, **result}
        model.save_pretrained(st.path(MODEL_DIR))
        tokenizer.save_pretrained(st.path(MODEL_DIR))
        metrics = {
            **result,
            "n_train": len(data["train"]),
            "n_validation": len(data["validation"]),
            "n_test": len(data["test"]),
            "seconds": time.perf_counter() - t0,
            "data_source": data.source,
            **({"max_length": max_length} if max_length != int(cfg.model.max_length) else {}),
            **set_up,
        }
        write_json(st.path("metrics.json"), metrics)
        for split in ("train", "validation", "test"):
            tracking_models.log_dataset(data[split], f"{data.name}/{split}", split, targets="label")
        # the MLflow model first, so the run's results are linked to it in the UI
        model_id = (
            tracking_models.log_hf_model(model, tokenizer) if cfg.tracking.log_model else None
        )
        st.log_metrics(mlflow_metrics(metrics), model_id=model_id)
        st.log_file(st.path("metrics.json"))
        return {
            "run_dir": str(st.run_dir),
            "run_id": st.tracking.run_id,
            **metrics,
            "objective": metrics["val_accuracy"],
        }
