"""An ASP job under torchrun's elastic agent on this machine, one agent per emulated node, started, killed and read
back at will (the asp_torchrun scenario and ``tests/elastic/test_torchrun.py``). The launch is docs/elastic.md's
recipe: ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` and short rendezvous timeouts (a dead node is dropped after 3 s).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness.launch import child_env, free_port, spawn, wait_for

WORKER = Path(__file__).resolve().parents[1] / "examples" / "elastic" / "asp_torchrun_worker.py"
RDZV_CONF = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"


def _descendants(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            children += [int(child) for child in (task / "children").read_text().split()]
    return [grandchild for child in children for grandchild in (child, *_descendants(child))]


def _read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


class TorchrunJob:
    """Agents of one job writing into ``out`` (JSON lines, ``ckpt/``, logs); ``worker_args`` go to every worker."""

    def __init__(self, out: Path, nnodes: str = "2:3", max_restarts: int = 3, worker_args: tuple[str, ...] = ()):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.ckpt = self.out / "ckpt"
        self.port = free_port()
        self.nnodes, self.max_restarts, self.worker_args = nnodes, max_restarts, worker_args
        self.agents: dict[str, subprocess.Popen] = {}
        self.started: dict[str, float] = {}  # time.time() at each agent's start
        self.killed: dict[str, float] = {}

    def command(self) -> list[str]:
        """The agent's command line: the recipe of docs/elastic.md."""
        return [
            sys.executable, "-m", "torch.distributed.run", f"--nnodes={self.nnodes}", "--nproc-per-node=1",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{self.port}", "--rdzv-id=asp-job",
            f"--max-restarts={self.max_restarts}", "--monitor-interval=0.5", f"--rdzv-conf={RDZV_CONF}",
            str(WORKER), str(self.out), str(self.ckpt), *self.worker_args,
        ]  # fmt: skip

    def start(self, name: str) -> None:
        """Start the agent of node ``name`` (in its own session: killing it kills its worker too)."""
        env = child_env(NODE_NAME=name, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", PYTHONUNBUFFERED="1")
        self.started[name] = time.time()
        self.agents[name] = spawn(self.command(), self.out / f"{name}.log", env)

    def wait_for_rendezvous_store(self, timeout_s: float = 60) -> None:
        """Wait until the first agent hosts the rendezvous store (so that it, not a later one, is its host)."""
        self.wait_until(self._store_listens, timeout_s, "the rendezvous store to listen")

    def _store_listens(self) -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def kill(self, name: str) -> None:
        """SIGKILL node ``name``'s agent and its workers (a machine lost): torchrun starts each worker in a session
        of its own, so the agent's process group and each descendant's are killed."""
        self.killed[name] = time.time()
        agent = self.agents[name]
        for pid in [agent.pid, *_descendants(agent.pid)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        agent.wait()

    def wait_until(self, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Poll ``predicate``; fail naming ``what`` after ``timeout_s`` or when every agent has exited."""
        ended = lambda: all(agent.poll() is not None for agent in self.agents.values())  # noqa: E731
        if not wait_for(lambda: predicate() or ended(), timeout_s):
            raise TimeoutError(f"waited {timeout_s:g} s for {what}\n{self.tails()}")
        if not predicate():
            raise RuntimeError(f"every agent exited while waiting for {what}\n{self.tails()}")

    def wait(self, timeout_s: float) -> dict[str, int | None]:
        """Wait for the agents still running; each one's exit status (``None``: killed, by us or the timeout)."""
        deadline = time.monotonic() + timeout_s
        for name, agent in self.agents.items():
            if name not in self.killed and not wait_for(
                lambda a=agent: a.poll() is not None, deadline - time.monotonic()
            ):
                self.kill(name)
        return {name: None if name in self.killed else agent.returncode for name, agent in self.agents.items()}

    def close(self) -> None:
        """Kill whatever still runs."""
        for name, agent in self.agents.items():
            if agent.poll() is None:
                self.kill(name)

    def __enter__(self) -> TorchrunJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def attempts(self) -> list[dict[str, Any]]:
        """Each attempt's record, in order (rank 0 writes it at the start of training)."""
        return _read_lines(self.out / "attempts.jsonl")

    def steps(self) -> list[dict[str, Any]]:
        """One record per training step of every rank, in the order written."""
        return _read_lines(self.out / "steps.jsonl")

    def final(self) -> dict[str, Any] | None:
        """What the final attempt's rank 0 wrote."""
        path = self.out / "final.json"
        return json.loads(path.read_text()) if path.exists() else None

    def tails(self) -> str:
        return "\n".join(f"--- {path.name} ---\n{path.read_text()[-3000:]}" for path in sorted(self.out.glob("*.log")))


def join_and_leave(
    job: TorchrunJob,
    hold: Path | None = None,
    join_after_s: float = 0.0,
    leave_after_s: float | None = 0.0,
    timeout_s: float = 150,
) -> dict:
    """The scripted run, each agent's exit status: nodes ``a`` and ``b`` start; once a checkpoint exists ``c`` joins;
    once the attempt with ``c`` has written one, ``c`` is killed (``leave_after_s=None``: it stays). With a ``hold``
    file the attempts wait at an epoch's start for each change; without, the changes come ``join_after_s`` and
    ``leave_after_s`` after those checkpoints."""
    deadline = time.monotonic() + timeout_s
    left = lambda: deadline - time.monotonic()  # noqa: E731
    if hold is not None:
        hold.write_text("2 3")
    job.start("a")
    job.wait_for_rendezvous_store(timeout_s=60)
    job.start("b")
    if hold is not None:
        job.wait_until(lambda: _held(job, 2) == 2, left(), "2 ranks holding after a checkpoint")
    else:
        job.wait_until(lambda: (job.ckpt / "last.ckpt").exists(), left(), "a first checkpoint")
        time.sleep(join_after_s)
    job.start("c")
    job.wait_until(lambda: _attempt_of(job, 3) is not None, left(), "an attempt with world size 3")
    if leave_after_s is not None:
        if hold is not None:
            job.wait_until(lambda: _held(job, 3) == 3, left(), "3 ranks holding after a checkpoint")
        else:
            resumed = _attempt_of(job, 3)["epoch"]
            wrote = lambda: any(s["world_size"] == 3 and s["epoch"] > resumed for s in job.steps())  # noqa: E731
            job.wait_until(wrote, left(), "an epoch's end with world size 3")
            time.sleep(leave_after_s)
        job.kill("c")
    if hold is not None:
        hold.unlink()
    return job.wait(left())


def _held(job: TorchrunJob, world_size: int) -> int:
    return len(list(job.out.glob(f"held_w{world_size}_r*")))


def _attempt_of(job: TorchrunJob, world_size: int) -> dict[str, Any] | None:
    return next((a for a in job.attempts() if a["world_size"] == world_size), None)
