"""A one-node SLURM cluster on this machine, for the tests and for trying a cluster config.

``sudo make slurm-local`` (``python src/saleval/scaleout/slurm_local.py start``) writes a
``slurm.conf`` into a folder of its own (default ``.slurm-local/``), starts ``munged``,
``slurmctld`` and ``slurmd`` there and prints the ``SLURM_CONF`` to export; ``stop`` ends
them. The module imports nothing but the standard library, so root runs it with the
system's Python, without building or touching the project's virtual environment. Nothing under ``/etc`` is read or written, and the daemons listen on free loopback
ports, so it runs beside a real SLURM client config and beside other such clusters. The
walk of docs/scale-out.md starts one through ``make slurm-local``
(``tests/test_scaleout_page.py``).

What it needs: the Debian packages ``slurm-wlm`` and ``munge`` (``slurmctld``, ``slurmd``,
``munged``, ``sbatch`` on PATH) and root, since ``slurmd`` starts each job as its user.
:func:`missing` says which is lacking and the command that installs it.

Choices that make one small node behave (docs/scale-out.md): ``proctrack/linuxproc`` and
``task/none`` (no cgroups, no systemd), no accounting (``squeue`` answers what ``sacct``
would), memory and cores consumable (``CR_Core_Memory``: a job that asks for more than the
node has is refused, as on a real cluster), and a short ``KillWait`` so a cancelled job's
processes are gone within seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

#: the commands a cluster of one node needs, and the package each comes in
_COMMANDS = {
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sbatch": "slurm-client",
}
INSTALL = "apt-get install -y slurm-wlm munge"


def missing() -> str | None:
    """Why no cluster can start here (one line naming the install command), or None."""
    absent = [c for c in _COMMANDS if shutil.which(c) is None and not Path("/usr/sbin", c).exists()]
    if absent:
        return f"{', '.join(absent)} not found: {INSTALL} (as root; .ci/run does this)"
    if os.geteuid() != 0:
        return "a local SLURM cluster needs root (slurmd starts jobs as their user): run as root"
    return None


def _which(command: str) -> str:
    return shutil.which(command) or str(Path("/usr/sbin", command))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _memory_mb() -> int:
    """This machine's memory in MB, as ``slurmd -C`` counts it."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 4096


@dataclass
class LocalCluster:
    """One node (``localhost``) in one partition, all its files under ``root``.

    ``memory_mb`` and ``cpus`` are what the node offers jobs (at most the machine's; less
    makes a small node to test a config against); ``max_time_min`` is the partition's
    time limit.
    """

    root: Path
    partition: str = "debug"
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    memory_mb: int = field(default_factory=lambda: min(_memory_mb() - 512, 16_000))
    max_time_min: int = 60
    node: str = "localhost"

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def controller_pidfile(self) -> Path:
        """Where the cluster's ``slurmctld`` writes its pid: whether it runs is read there."""
        return self.root / "slurmctld.pid"

    def env(self) -> dict[str, str]:
        """What a client (``sbatch``, ``srun``, a Hydra launcher) needs in its environment."""
        return {"SLURM_CONF": str(self.conf)}

    def _write(self) -> None:
        for sub in ("state", "spool", "log", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)  # every user's sbatch reads slurm.conf
        munge = self.root / "munge"
        munge.chmod(0o755)  # clients (sbatch of any user) reach the socket; the key stays 0400
        key = munge / "munge.key"
        if not key.exists():
            key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        r = self.root
        self.conf.write_text(
            "\n".join(
                [
                    "# written by saleval.scaleout.slurm_local: one node on this machine",
                    "ClusterName=saleval-local",
                    "SlurmctldHost=localhost(127.0.0.1)",
                    # bind to those addresses, not to every interface (SLURM's default)
                    "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny",
                    f"SlurmctldPort={_free_port()}",
                    f"SlurmdPort={_free_port()}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={munge / 'munge.socket'}",
                    f"StateSaveLocation={r / 'state'}",
                    f"SlurmdSpoolDir={r / 'spool'}",
                    f"SlurmctldPidFile={self.controller_pidfile}",
                    f"SlurmdPidFile={r / 'slurmd.pid'}",
                    f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SwitchType=switch/none",
                    "MpiDefault=none",
                    "SchedulerType=sched/backfill",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core_Memory",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "ReturnToService=2",
                    "KillWait=3",
                    "MinJobAge=600",
                    "InactiveLimit=0",
                    "SlurmdTimeout=300",
                    f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} "
                    f"RealMemory={self.memory_mb} State=UNKNOWN",
                    f"PartitionName={self.partition} Nodes={self.node} Default=YES "
                    f"MaxTime={self.max_time_min} State=UP",
                    "",
                ]
            )
        )

    def _daemon(self, args: list[str]) -> None:
        env = {**os.environ, **self.env()}
        out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"{args[0]} exited {out.returncode}: {out.stderr.strip()}")

    def start(self, timeout: float = 60.0) -> float:
        """Write the config, start the three daemons, wait until the node takes jobs;
        returns the seconds that took."""
        t0 = time.monotonic()
        self._write()
        munge = self.root / "munge"
        self._daemon(
            [
                _which("munged"),
                "--force",
                f"--key-file={munge / 'munge.key'}",
                f"--socket={munge / 'munge.socket'}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}",
            ]
        )
        self._daemon([_which("slurmctld"), "-f", str(self.conf)])
        self._daemon([_which("slurmd"), "-f", str(self.conf), "-N", self.node])
        deadline = t0 + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.node_state()
            if state in ("idle", "mixed", "allocated"):  # "idle*": not responding yet
                return time.monotonic() - t0
            time.sleep(0.3)
        logs = "\n".join(
            p.read_text()[-1500:] for p in sorted((self.root / "log").glob("*.log")) if p.exists()
        )
        self.stop()
        raise RuntimeError(
            f"the local SLURM node is {state or 'not up'} after {timeout:.0f} s:\n{logs}"
        )

    def node_state(self) -> str:
        """``sinfo``'s state of the node (``idle``, ``down*``...), or '' when none answers.

        With no ``slurmctld`` of this cluster running nothing can answer, and ``sinfo``
        would spend its message timeout (about 9 s) finding that out: '' at once."""
        if not _alive(self.controller_pidfile):
            return ""
        try:
            out = subprocess.run(
                [_which("sinfo"), "-h", "-N", "-o", "%T", "-n", self.node],
                env={**os.environ, **self.env()},
                capture_output=True,
                text=True,
                timeout=10,
            )
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return out.stdout.strip() if out.returncode == 0 else ""

    def stop(self) -> None:
        """End every job (so no process outlives the cluster), then the daemons."""
        env = {**os.environ, **self.env()}
        if self.conf.exists() and _alive(self.controller_pidfile):  # else none to ask
            subprocess.run(
                [_which("scancel"), "--full", "--partition", self.partition],
                env=env,
                capture_output=True,
                timeout=30,
            )
        for pidfile in (self.root / "slurmd.pid", self.controller_pidfile,
                        self.root / "munge" / "munged.pid"):  # fmt: skip
            _kill_pidfile(pidfile)


def _pid(pidfile: Path) -> int | None:
    """The process id a pid file names; None when there is no readable one."""
    try:
        return int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pidfile: Path) -> bool:
    """Whether the process a pid file names is running (a stale file: not)."""
    pid = _pid(pidfile)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True  # running, as another user
    except OSError:
        return False  # no such process
    return True


def _kill_pidfile(path: Path, wait: float = 3.0) -> None:
    """SIGTERM the process a pid file names and wait for it (then SIGKILL)."""
    pid = _pid(path)
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    """``start`` / ``stop`` / ``status`` a local cluster in ``--dir`` (default ``.slurm-local``)."""
    parser = argparse.ArgumentParser(
        prog="slurm_local.py",
        description="A one-node SLURM cluster on this machine (docs/scale-out.md).",
    )
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("--dir", default=".slurm-local", help="where its files go")
    parser.add_argument("--partition", default="debug")
    parser.add_argument("--memory-mb", type=int, default=None, help="memory the node offers")
    parser.add_argument("--cpus", type=int, default=None, help="cores the node offers")
    parser.add_argument("--max-time-min", type=int, default=60, help="the partition's limit")
    args = parser.parse_args(argv)
    cluster = LocalCluster(Path(args.dir), args.partition, max_time_min=args.max_time_min)
    if args.memory_mb:
        cluster.memory_mb = args.memory_mb
    if args.cpus:
        cluster.cpus = args.cpus
    if args.action == "stop":
        cluster.stop()
        print(f"stopped the local SLURM cluster in {cluster.root}")
        return 0
    if args.action == "status":
        state = cluster.node_state() if cluster.conf.exists() else ""
        print(f"{cluster.node}: {state or 'not running'}")
        return 0 if state else 1
    reason = missing()
    if reason:
        print(f"slurm_local: {reason}", file=sys.stderr)
        return 2
    seconds = cluster.start()
    print(
        f"a one-node SLURM cluster is up in {seconds:.1f} s "
        f"(partition {cluster.partition}: {cluster.cpus} cores, {cluster.memory_mb} MB, "
        f"{cluster.max_time_min} min)\n"
        f"  export SLURM_CONF={cluster.conf}\n"
        f"  stop it: {stop_command(cluster.root)}"
    )
    return 0


def stop_command(root: Path) -> str:
    """The command that stops the cluster in ``root``, as its starter can paste it: the
    make target when make started it (``make`` sets ``MAKELEVEL``), else this file run by
    this Python; ``sudo`` first when sudo started it."""
    sudo = "sudo " if os.environ.get("SUDO_USER") else ""
    if os.environ.get("MAKELEVEL") and root.name == ".slurm-local":
        return f"{sudo}make slurm-local-stop"
    return sudo + shlex.join(
        [sys.executable, str(Path(__file__).resolve()), "stop", "--dir", str(root)]
    )


if __name__ == "__main__":
    raise SystemExit(main())
