"""A stage run's ``run.json`` kept in step with its run dir and its tracking store
(docs/architecture.md): the checksum of every table as it is written, the provenance,
what the store has taken, and how the run ended.

:class:`~saleval.pipeline.stage.Stage` holds one :class:`StageRecord`; its end is here
because ending a run is mostly recording it: the last metrics and files, the final
``run.json``, then the MLflow run's end, with a second failure never hiding the first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from saleval.pipeline.records import run_record
from saleval.pipeline.records.provenance import Provenance
from saleval.pipeline.records.run_inputs import RunInputs
from saleval.pipeline.records.run_record import RunRecord
from saleval.pipeline.tracker import tracking
from saleval.pipeline.tracker.stage_tracking import StageTracking

log = logging.getLogger(__name__)


class StageRecord:
    """``run.json`` of one stage run (:class:`RunRecord`), rewritten as the run goes."""

    def __init__(
        self,
        stage: str,
        run_dir: Path,
        fingerprint: str,
        inputs: RunInputs,
        tracking_: StageTracking,
        provenance: Callable[[], Provenance],
    ) -> None:
        self.stage, self.run_dir, self.fingerprint = stage, run_dir, fingerprint
        self.inputs, self.tracking, self.provenance = inputs, tracking_, provenance
        #: the declared tables written (their checksums go into run.json)
        self.tables: list[str] = []
        self._recorded: dict[str, Any] | None = None  # the tracking record last written
        #: how the run ended, once :meth:`finish` has run
        self.status = "RUNNING"
        self.failure: BaseException | None = None

    def write(self, status: str, seconds: float | None = None, error: str | None = None) -> None:
        """The run's record with the checksum of every table written so far and what its
        tracking store has taken, written into the run dir."""
        import mlflow

        recorded = self.tracking.record()
        provenance = self.provenance()
        RunRecord(
            stage=self.stage,
            run_id=self.tracking.run_id,
            tracking_uri=mlflow.get_tracking_uri(),
            fingerprint=self.fingerprint,
            parents={k: r.run_id for k, r in self.inputs.records.items()},
            parent_dirs={k: str(p) for k, p in self.inputs.runs.items()},
            simulated=provenance.simulated,
            provenance=provenance,
            host=socket.gethostname(),
            pid=os.getpid(),
            mlflow_view=self.tracking.view,
            checksums=run_record.table_checksums(self.run_dir, self.tables),
            tracking=recorded,
            status=status,
            seconds=seconds,
            error=error,
        ).write(self.run_dir)
        self._recorded = recorded

    def finish(self, status: str, seconds: float, exc: BaseException | None) -> None:
        """The run's last metrics and files and its final record. The work done but its
        record unwritable is FAILED (raised); after a failure, a second one (the disk is
        full, say) is a warning, never hiding the first."""
        self.status, self.failure = status, exc
        try:
            if exc is None:
                tracking.log_metrics({"stage_seconds": seconds})
                tracking.log_files([self.run_dir / "config.yaml"])
                self.write(status=status, seconds=seconds)
                tracking.log_files([RunRecord.path_in(self.run_dir)])
            else:
                self.write(status=status, seconds=seconds, error=repr(exc))
        except Exception as err:
            if exc is not None:
                log.warning("%s: could not record the run's end: %s", self.run_dir, err)
                return
            self.status, self.failure = "FAILED", err
            with contextlib.suppress(Exception):
                self.write(status="FAILED", seconds=seconds, error=repr(err))
            raise

    def end(self, seconds: float) -> None:
        """End the MLflow run as :meth:`finish` left it; when its store missed part of the
        run, ``run.json`` then says what (its ``tracking`` record), the work being complete
        on disk."""
        status, exc = self.status, self.failure
        try:
            self.tracking.end(status)
        except Exception as err:
            if exc is None:
                raise
            log.warning("%s: could not end its MLflow run: %s", self.run_dir, err)
        record = self.tracking.record()
        if record is not None and record != self._recorded:
            try:
                extra = (
                    {"seconds": seconds}
                    if exc is None
                    else {"seconds": seconds, "error": repr(exc)}
                )
                self.write(status=status, **extra)
            except OSError as err:
                log.warning("%s: could not record what was not logged: %s", self.run_dir, err)
