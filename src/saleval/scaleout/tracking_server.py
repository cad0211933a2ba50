"""The lab's tracking server: ``mlflow server`` without the lines nobody acts on.

``python -m saleval.scaleout.tracking_server [mlflow server options]`` runs ``mlflow
server`` with the options given, unchanged (docs/scale-out.md, *One tracking server*),
and two differences:

* MLflow's own import of ``starlette.middleware.wsgi`` warns (``StarletteDeprecationWarning``)
  once in the server and once in each uvicorn worker. Nothing a user of the server can act
  on: that warning, from that module, is filtered in every process of the server through
  ``PYTHONWARNINGS``, which they inherit.
* The ``basic-auth`` app logs "This feature is still experimental" once per worker.
  :class:`DropExperimental`, on MLflow's ``mlflow.server.auth`` logger, drops that line;
  it reaches the workers through the uvicorn log configuration MLflow gives them (MLflow's
  own, the filter added). Every other line of MLflow and uvicorn shows as before.

SIGTERM and SIGHUP sent to this command go on to ``mlflow server``, which stops its
workers; Ctrl-C reaches them all from the terminal.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: ``-W`` filter (action:message:category:module) for MLflow's deprecated import
STARLETTE_WARNING = (
    "ignore:starlette.middleware.wsgi is deprecated:UserWarning:mlflow.server.fastapi_app"
)
#: the start of the basic-auth app's line that :class:`DropExperimental` drops
EXPERIMENTAL = "This feature is still experimental"
#: options of ``mlflow server`` that choose another web server than uvicorn
_OTHER_SERVERS = ("--gunicorn-opts", "--waitress-opts")


class DropExperimental(logging.Filter):
    """Drops the basic-auth app's "still experimental" line (module docstring).

    >>> record = logging.LogRecord("mlflow.server.auth", logging.WARNING, "", 0,
    ...     EXPERIMENTAL + " and may change", None, None)
    >>> DropExperimental().filter(record)
    False
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(EXPERIMENTAL)


def log_config() -> dict[str, Any]:
    """MLflow's uvicorn log configuration with :class:`DropExperimental` on the
    ``mlflow.server.auth`` logger."""
    import yaml
    from mlflow.server import _UVICORN_LOG_CONFIG

    config: dict[str, Any] = yaml.safe_load(Path(_UVICORN_LOG_CONFIG).read_text())
    config.setdefault("filters", {})["saleval_experimental"] = {
        "()": "saleval.scaleout.tracking_server.DropExperimental"
    }
    loggers = config.setdefault("loggers", {})
    loggers.setdefault("mlflow.server.auth", {})["filters"] = ["saleval_experimental"]
    return config


def server_args(args: Sequence[str], log_config_path: Path) -> list[str]:
    """``mlflow server``'s arguments with the log configuration given to uvicorn, unless
    the user gave one or chose gunicorn or waitress.

    >>> server_args(["--port", "5000"], Path("/x.json"))
    ['--port', '5000', '--uvicorn-opts', '--log-config /x.json']
    >>> server_args(["--uvicorn-opts", "--timeout-keep-alive 10"], Path("/x.json"))
    ['--uvicorn-opts', '--timeout-keep-alive 10 --log-config /x.json']
    >>> server_args(["--uvicorn-opts=--log-config mine.yaml"], Path("/x.json"))
    ['--uvicorn-opts=--log-config mine.yaml']
    """
    out = list(args)
    if any(a.split("=")[0] in _OTHER_SERVERS for a in out):
        return out
    ours = f"--log-config {log_config_path}"
    for i, arg in enumerate(out):
        if arg == "--uvicorn-opts" and i + 1 < len(out):
            if "--log-config" not in out[i + 1]:
                out[i + 1] = f"{out[i + 1]} {ours}"
            return out
        if arg.startswith("--uvicorn-opts="):
            if "--log-config" not in arg:
                out[i] = f"{arg} {ours}"
            return out
    return [*out, "--uvicorn-opts", ours]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``mlflow server`` with ``argv`` (module docstring); its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(__doc__.strip().splitlines()[0] + "\n(the options are mlflow server's:)\n")
    env = dict(os.environ)
    env["PYTHONWARNINGS"] = ",".join(w for w in (env.get("PYTHONWARNINGS"), STARLETTE_WARNING) if w)
    with tempfile.TemporaryDirectory(prefix="saleval-mlflow-") as tmp:
        config = Path(tmp, "uvicorn-log.json")
        config.write_text(json.dumps(log_config()))
        command = [sys.executable, "-m", "mlflow", "server", *server_args(args, config)]
        proc = subprocess.Popen(command, env=env)

        def forward(signum: int, frame: Any) -> None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)

        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, forward)
        signal.signal(signal.SIGINT, lambda signum, frame: None)  # the terminal's group has it
        return proc.wait()


if __name__ == "__main__":
    raise SystemExit(main())
