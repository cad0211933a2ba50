"""Progress where it lands (saleval.progress): a bar at a terminal; in a file (a job's log)
plain lines, a bounded number of them, no carriage returns or escape codes."""

from __future__ import annotations

import logging
import types
from pathlib import Path

import pytest
import torch

from saleval import progress
from saleval.modeling.training import EpochLines


def _logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == progress.log.name]


def test_a_loop_in_a_file_says_where_it_stands_in_a_few_plain_lines(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "interactive", lambda stream=None: False)
    caplog.set_level(logging.INFO, logger=progress.log.name)
    assert list(progress.bar(range(1000), "records")) == list(range(1000))
    lines = _logged(caplog)
    assert len(lines) == progress.LINES  # one per tenth, the last being the end
    assert lines[0].startswith("records: 100/1000 (10%), ")
    assert lines[-1].startswith("records: 1000/1000 (100%), ")
    assert not any("\r" in ln or "\x1b" in ln for ln in lines)
    caplog.clear()
    assert list(progress.bar(range(3), "methods")) == [0, 1, 2]  # short: one line each
    assert [ln.split(",")[0] for ln in _logged(caplog)] == [
        "methods: 1/3 (33%)", "methods: 2/3 (67%)", "methods: 3/3 (100%)"
    ]  # fmt: skip
    caplog.clear()
    # an inner loop (the batches of one step) and a terminal-only bar say nothing in a file
    assert list(progress.bar(range(50), "batches", leave=False)) == list(range(50))
    assert list(progress.bar(range(50), "designs", disable=None)) == list(range(50))
    assert list(progress.bar(range(50), "off", disable=True)) == list(range(50))
    assert _logged(caplog) == []


def test_a_loop_at_a_terminal_gets_a_bar(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tqdm.auto import tqdm

    with (tmp_path / "job.err").open("w") as fh:
        assert not progress.interactive(fh)  # a file is no terminal
    monkeypatch.setattr(progress, "interactive", lambda stream=None: True)
    shown = progress.bar(range(3), "methods")
    assert isinstance(shown, tqdm)
    shown.close()


def test_training_in_a_file_logs_one_line_per_epoch(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=progress.log.name)
    metrics = {"val_acc": torch.tensor(0.75), "train_loss_epoch": torch.tensor(0.5), "x": 1.0}
    trainer = types.SimpleNamespace(
        global_rank=0, callback_metrics=metrics, current_epoch=1, max_epochs=3
    )
    lines = EpochLines()
    lines.on_train_epoch_end(trainer, None)  # type: ignore[arg-type]
    trainer.global_rank = 1  # another rank says nothing
    lines.on_train_epoch_end(trainer, None)  # type: ignore[arg-type]
    (line,) = _logged(caplog)
    assert line.startswith("epoch (train_loss 0.5000, val_accuracy 0.7500): 2/3 (67%), ")
