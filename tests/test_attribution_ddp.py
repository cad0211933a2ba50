"""Attribution on several devices (issue #10): two CPU processes (gloo) write the tables of one.

The explain stage runs once on one device and once under ``trainer=ddp_cpu`` (two
spawned workers); the tables must have the same rows in the same order and the same
numbers for every method — seeded ones (random, LIME) included, since they draw per
(seed, text) — and only the calling process writes files and logs one MLflow run. Small
batch sizes give every phase several batches, so both ranks work and the shards are
uneven. Cheaper checks cover the launcher choice and a rank > 0 stage.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from lightning.pytorch.strategies.launchers import (
    _MultiProcessingLauncher,
    _SubprocessScriptLauncher,
)
from mlflow.tracking import MlflowClient

from saleval.attribution import Attributor, Texts
from saleval.attribution.distributed import make_trainer
from saleval.pipeline import tables
from saleval.pipeline.stage import _RANK_VARS, Stage, is_main_process
from saleval.pipeline.tracker.tracking_reads import method_rows
from saleval.vocab import PROBS
from tests.cli_support import environment
from tests.conftest import compose_config

#: the explain stage's default methods (all nine), as conf/explain.yaml lists them
METHODS = list(compose_config("explain").method)


class ProcessId(Attributor):
    """Scores every word with the id of the process that explained it (which rank ran what)."""

    def word_scores(self, texts: Texts) -> list[np.ndarray]:
        return [np.full(s.n_words, float(os.getpid())) for s in texts.segs]


def _explain(make_cfg, model_dir: Path, name: str, extra: list[str]) -> Path:
    from saleval.stages import explain

    overrides = [
        f"inputs.model={model_dir}",
        "dataset=ag_news",  # named (and checked against the train run's) to shrink its splits
        "dataset.max_train=160",
        "dataset.max_validation=64",
        "dataset.max_test=64",
        "data.n_samples=10",
        "batch_size=4",  # predictions: batches of 4, 4, 2
        "method.integrated_gradients.n_steps=4",
        "method.lime.num_samples=20",
        *[f"method.{m}.batch_size={2 + i % 2}" for i, m in enumerate(METHODS)],
        "progress=false",
        "view.samples=1",
        "view.overlap_k=5",
        *extra,
    ]
    return Path(explain.run(make_cfg("explain", overrides, name=name))["run_dir"])


def _runs_logged_from(run_dir: Path) -> list:
    client = MlflowClient()
    exps = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(exps, filter_string=f"tags.run_dir = '{run_dir}'")


@pytest.mark.slow
def test_two_cpu_processes_write_the_single_device_tables(tiny_train_run: Path, make_cfg) -> None:
    one = _explain(make_cfg, tiny_train_run, "one_device", ["trainer=cpu"])
    two = _explain(
        make_cfg,
        tiny_train_run,
        "two_processes",
        [
            "trainer=ddp_cpu",
            "+method.pid._target_=tests.test_attribution_ddp.ProcessId",
            "+method.pid.batch_size=2",
        ],
    )
    pred1, pred2 = tables.PREDICTIONS.read(one), tables.PREDICTIONS.read(two)
    attr1, attr2 = tables.ATTRIBUTIONS.read(one), tables.ATTRIBUTIONS.read(two)

    # the workers really were two other processes, one per rank
    pids = attr2.loc[attr2.method == "pid", "score"].unique()
    assert len(pids) == 2 and float(os.getpid()) not in pids
    attr2 = attr2[attr2.method != "pid"].reset_index(drop=True)

    # same rows, same order; numbers equal up to the noise of another thread count
    assert set(attr1["method"]) == set(METHODS)
    probs = PROBS.of(pred1.columns)
    pd.testing.assert_frame_equal(pred1.drop(columns=probs), pred2.drop(columns=probs))
    np.testing.assert_allclose(pred1[probs], pred2[probs], rtol=1e-5, atol=1e-7)
    pd.testing.assert_frame_equal(attr1.drop(columns="score"), attr2.drop(columns="score"))
    for m in METHODS:
        a, b = (x.loc[x.method == m, "score"].to_numpy() for x in (attr1, attr2))
        scale = max(float(np.abs(a).max()), 1e-12)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * scale, err_msg=m)

    # the calling process alone wrote and logged: one MLflow run per run dir
    for run_dir in (one, two):
        runs = _runs_logged_from(run_dir)
        assert len(runs) == 1
        assert runs[0].info.run_id == json.loads((run_dir / "run.json").read_text())["run_id"]
    r1, r2 = (
        method_rows(_runs_logged_from(d)[0].info.run_id).set_index("method") for d in (one, two)
    )
    # diagnostics come back from both ranks, in the single-device order (one child run
    # per method)
    for method, key in (
        ("integrated_gradients", "convergence_delta_abs_mean"),
        ("lime", "surrogate_r2_mean"),
    ):
        assert r2.loc[method, key] == pytest.approx(r1.loc[method, key], rel=1e-3, abs=1e-6)
    assert _runs_logged_from(two)[0].data.metrics["n_samples"] == 10
    assert r2.loc["occlusion", "seconds"] > 0


def test_make_trainer_spawns_instead_of_rerunning_the_command(monkeypatch) -> None:
    for var in (*_RANK_VARS, "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert make_trainer({"accelerator": "cpu"}).num_devices == 1  # devices: auto → one
    # a plain `ddp` would re-run sys.argv (the Hydra app, or pytest) for rank 1
    trainer = make_trainer({"accelerator": "cpu", "devices": 2, "strategy": "ddp"})
    assert isinstance(trainer.strategy.launcher, _MultiProcessingLauncher)
    assert trainer.strategy.launcher._start_method == "spawn"
    fork = make_trainer({"accelerator": "cpu", "devices": 2, "strategy": "ddp_fork"})
    assert fork.strategy.launcher._start_method == "fork"
    one = make_trainer({"accelerator": "cpu", "devices": 1, "strategy": "ddp"})
    assert one.strategy.launcher is None  # one device: no process group at all
    # processes started by torchrun / srun / Lightning's launcher: join them as they are
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    joined = make_trainer({"accelerator": "cpu", "devices": 2, "strategy": "ddp"})
    assert isinstance(joined.strategy.launcher, _SubprocessScriptLauncher)
    assert joined.strategy.cluster_environment.creates_processes_externally


def test_sigterm_ends_a_job_inside_lightnings_predict_loop_at_once() -> None:
    """In Lightning's predict loop (the ranks of several devices) a SIGTERM ends the job as
    Ctrl-C does, mid-job: Lightning's own handler would only set a flag its loops read
    between batches, and the whole job is one batch, so the job's 60 s would run out first.
    (On one process the job runs outside Lightning: tests/test_cli.py stops it there.)"""
    code = textwrap.dedent(
        """
        import os, signal, time
        import torch
        from saleval.attribution import distributed

        def job(model, rank, world):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(60)
            return {}

        distributed.predict({"accelerator": "cpu"}, torch.nn.Linear(2, 2), job)
        print("the job ran to its end")
        """
    )
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        env=environment(),
    )  # fmt: skip
    assert done.returncode != 0, done.stdout + done.stderr
    assert "the job ran to its end" not in done.stdout
    assert time.monotonic() - start < 45, "the SIGTERM waited for the job's end"


def test_a_stage_in_a_rank_above_zero_writes_and_logs_nothing(
    monkeypatch, make_cfg, mlflow_uri
) -> None:
    for var in _RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    assert is_main_process()
    for var in ("LOCAL_RANK", "RANK", "NODE_RANK", "SLURM_PROCID"):
        monkeypatch.setenv(var, "1")
        assert not is_main_process()
        monkeypatch.setenv(var, "0")
        assert is_main_process()
    monkeypatch.setenv("LOCAL_RANK", "1")
    cfg = make_cfg("explain", name="rank1")
    frame = pd.DataFrame({"sample_id": ["a"], "text": ["x"], "label": [0], "pred": [0]})
    with Stage(cfg, "explain") as st:
        assert not st.is_main and st.tracking.run_id is None
        st.write(tables.PREDICTIONS, frame)
        st.log_metrics({"n": 1.0})
        st.tracking.set_tags({"verification": "passed"})
    assert not Path(cfg.run_dir).exists()
    assert _runs_logged_from(Path(cfg.run_dir).resolve()) == []


def test_length_grouped_training_shards_its_batches_over_ddp_processes(
    tmp_path: Path, mlflow_uri: str
) -> None:
    """The default length-grouped batches under ``trainer=ddp_cpu``: each of the two
    processes takes half of one seeded batch order (LengthGroupedBatches), so an epoch of
    160 texts in batches of 16 is 5 steps, not 10 (each process alone) and not 3 or 4
    (a sampler that dropped the grouping)."""
    import json
    import os
    import subprocess
    import sys

    run_dir = tmp_path / "ddp_train"
    script = Path(sys.executable).parent / "saleval-train"
    cmd = [
        str(script),
        "model=tiny",
        "trainer=ddp_cpu",
        "dataset=ag_news",
        "dataset.max_train=160",
        "dataset.max_validation=32",
        "dataset.max_test=32",
        "trainer.max_epochs=1",
        "trainer.progress_bar=false",
        "tracking.log_model=false",
        f"hydra.run.dir={run_dir}",
    ]
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_uri, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["steps"] == 5, metrics
    assert 0.0 <= metrics["test_accuracy"] <= 1.0
