"""Walk a documentation page: run its shell blocks as printed, as a user at a terminal would.

A page marks each fenced ``bash`` block with an HTML comment just above it, invisible once
rendered:

* ``<!-- walk: NAME -->``: step NAME. ``exits=N`` after the name: its commands may fail,
  with status N only (the page shows what they print);
* ``<!-- walk: NAME output -->`` above a plain fenced block: lines step NAME prints, in
  order; ``...`` stands for any text and ``<...>`` (a placeholder such as ``<sweep dir>``)
  for any text without spaces;
* ``<!-- walk: example NAME -->`` above a plain block: lines a test produces another way
  (:meth:`Page.example`);
* ``<!-- walk: no, WHY -->``: a block not walked, and why.

A block without a mark fails :meth:`Page.blocks`: nothing on the page escapes the walk
unnoticed. :class:`Shell` runs steps in one bash session, as one terminal: variables and
``export``s carry from step to step, each command's failure is recorded (bash's ``ERR``
trap), and the session's process group goes when the walk ends.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

_MARK = re.compile(r"<!--\s*walk:\s*(.*?)\s*-->\s*\n```(\w*)[^\n]*\n(.*?)\n```", re.S)
_END = "__WALK_END__"
_ERR = "__WALK_ERR__"


@dataclass(frozen=True)
class Block:
    """One marked block of the page."""

    name: str
    kind: str  # "step", "output", "example" or "no"
    text: str
    exits: int = 0
    why: str = ""


@dataclass
class Page:
    """The marked blocks of one Markdown page."""

    path: Path
    blocks: list[Block] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path) -> Page:
        text = path.read_text()
        fences = [m.start() for m in re.finditer(r"^```\w*", text, re.M)]
        page = cls(path)
        marked = set()
        for m in _MARK.finditer(text):
            label, lang, body = m.group(1), m.group(2), m.group(3)
            marked.add(m.start(0) + m.group(0).index("```"))
            if label == "no" or label.startswith("no,"):
                page.blocks.append(Block("", "no", body, why=label[2:].strip(" ,")))
                continue
            words = label.split()
            if words[0] == "example":
                page.blocks.append(Block(words[1], "example", body))
            elif len(words) > 1 and words[1] == "output":
                page.blocks.append(Block(words[0], "output", body))
            else:
                exits = next((int(w[6:]) for w in words[1:] if w.startswith("exits=")), 0)
                assert lang == "bash", f"{path}: step {words[0]} is a {lang or 'plain'} block"
                page.blocks.append(Block(words[0], "step", body, exits=exits))
        # every opening fence of a bash block is marked (closing fences are bare)
        opening = _opening_fences(text)
        unmarked = [
            text[:p].count("\n") + 1
            for p in fences
            if p in opening and opening[p] == "bash" and p not in marked
        ]
        assert not unmarked, f"{path}: bash blocks without a walk mark at lines {unmarked}"
        return page

    def steps(self) -> list[str]:
        return [b.name for b in self.blocks if b.kind == "step"]

    def step(self, name: str) -> Block:
        (found,) = [b for b in self.blocks if b.kind == "step" and b.name == name]
        return found

    def output(self, name: str) -> str | None:
        found = [b.text for b in self.blocks if b.kind == "output" and b.name == name]
        return found[0] if found else None

    def example(self, name: str) -> str:
        (found,) = [b.text for b in self.blocks if b.kind == "example" and b.name == name]
        return found


def _opening_fences(text: str) -> dict[int, str]:
    """Offset → language of every opening ``` fence (fences alternate open/close)."""
    out: dict[int, str] = {}
    inside = False
    for m in re.finditer(r"^```(\w*)", text, re.M):
        if not inside:
            out[m.start()] = m.group(1)
        inside = not inside
    return out


def pattern(line: str) -> re.Pattern[str]:
    """A page's output line as a regex: ``...`` any text, ``<...>`` any text without
    spaces (or itself), runs of spaces any run of spaces.

    >>> bool(pattern("job <id> ended ... (exit 2)").fullmatch("job 12_1 ended at once (exit 2)"))
    True
    """
    parts = re.split(r"(\.\.\.|<[^<>\s][^<>]*>|\s+)", line.strip())
    regex = ""
    for part in parts:
        if part == "...":
            regex += ".*?"
        elif part.startswith("<") and part.endswith(">") and len(part) > 2:
            regex += rf"(?:{re.escape(part)}|\S+?)"  # the output may say <...> itself
        elif part.isspace():
            regex += r"\s+"
        else:
            regex += re.escape(part)
    return re.compile(regex)


def missing_lines(expected: str, output: str) -> list[str]:
    """The lines of ``expected`` not found, in order, among ``output``'s lines."""
    lines = [" ".join(x.split()) for x in output.splitlines()]
    missing, at = [], 0
    for want in (x for x in expected.splitlines() if x.strip()):
        rx = pattern(" ".join(want.split()))
        hit = next((i for i in range(at, len(lines)) if rx.fullmatch(lines[i])), None)
        if hit is None:
            missing.append(want)
        else:
            at = hit + 1
    return missing


@dataclass
class Ran:
    """A step that ran: its output and the commands that failed (status, command)."""

    name: str
    output: str
    failed: list[tuple[int, str]]
    seconds: float


class Shell:
    """One bash session in a process group of its own; see the module docstring."""

    def __init__(self, cwd: Path, env: dict[str, str], log: Path) -> None:
        self.cwd, self.log = cwd, log
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.ran: list[Ran] = []
        self._send(f"trap 'echo \"{_ERR} $? $BASH_COMMAND\"' ERR")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.log.open("a") as fh:
            for line in self.proc.stdout:
                fh.write(line)
                fh.flush()
                self.lines.put(line)
        self.lines.put(None)

    def _send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def run(self, name: str, script: str, timeout: float) -> Ran:
        """Run ``script`` (a step's text) to its end; its output and failures."""
        n = len(self.ran)
        path = self.cwd / f".walk-{n}-{name}.sh"
        path.write_text(script + "\n")
        with self.log.open("a") as fh:
            fh.write(f"\n===== step {name} =====\n{script}\n----- output -----\n")
        t0 = time.monotonic()
        self._send(f"source {path} < /dev/null; echo {_END} {n}")
        out: list[str] = []
        failed: list[tuple[int, str]] = []
        while True:
            left = t0 + timeout - time.monotonic()
            try:
                line = self.lines.get(timeout=max(left, 0.1))
            except queue.Empty:
                self.close()
                raise TimeoutError(
                    f"step {name} ran over {timeout:.0f} s:\n{''.join(out)[-4000:]}"
                ) from None
            if line is None:
                raise RuntimeError(f"the shell ended during step {name}:\n{''.join(out)[-4000:]}")
            # a marker may follow output that did not end its line (curl's "OK")
            end = line.find(f"{_END} {n}")
            err = line.find(_ERR)
            mark = min(i for i in (end, err, len(line)) if i >= 0)
            if line[:mark]:
                out.append(line[:mark] + ("\n" if mark < len(line) else ""))
            if mark == end:
                break
            if mark == err:
                status, _, command = line[err + len(_ERR) :].strip().partition(" ")
                if not command.startswith(f"source {path}"):
                    failed.append((int(status), command))
        path.unlink(missing_ok=True)
        ran = Ran(name, "".join(out), failed, time.monotonic() - t0)
        with self.log.open("a") as fh:
            fh.write(f"----- step {name} took {ran.seconds:.1f} s -----\n")
        self.ran.append(ran)
        return ran

    def close(self) -> None:
        """End the session and every process left in its group (background jobs, a
        daemon that did not leave the group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
