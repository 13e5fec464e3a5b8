"""Jobs under torch's elastic agent (``torchrun --nnodes=MIN:MAX ...``): nodes that join and leave between attempts.

torchrun restarts every worker of the job, with the new world size, when a node joins (a membership change, not
counted against ``--max-restarts``) and when a worker fails (counted); each attempt resumes from the last
checkpoint. :class:`TorchrunAttempt` reads this attempt from the agent's environment and gives the Trainer the
``devices`` and ``num_nodes`` Lightning checks against ``WORLD_SIZE``; :class:`TorchrunRestarts` keeps the attempt's
membership in the checkpoint and prints (and logs) one line per attempt: the membership, where it resumed and why.
Nothing here imports torchft: it serves any strategy, ``AsyncPSStrategy`` in ASP included.

Example::

    >>> env = {"TORCHELASTIC_RUN_ID": "job7", "TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "3",
    ...        "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "3"}
    >>> attempt = TorchrunAttempt.from_env(env)
    >>> attempt.trainer_kwargs
    {'devices': 1, 'num_nodes': 3}
    >>> attempt_reason(attempt, {"world_size": 2, "restart_count": 1})
    'a node joined (world size 2 -> 3)'
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

_VARIABLES = {
    "run_id": "TORCHELASTIC_RUN_ID",
    "restart_count": "TORCHELASTIC_RESTART_COUNT",
    "max_restarts": "TORCHELASTIC_MAX_RESTARTS",
    "node_rank": "GROUP_RANK",
    "num_nodes": "GROUP_WORLD_SIZE",
    "local_world_size": "LOCAL_WORLD_SIZE",
    "world_size": "WORLD_SIZE",
}


@dataclass(frozen=True)
class TorchrunAttempt:
    """One attempt of a job under torchrun's elastic agent: its membership, as the agent set it in the environment.

    Args:
        run_id: the job's ``--rdzv-id``.
        restart_count: this node's agent's restarts after failures so far (each agent counts its own;
            membership changes do not count); the line rank 0 prints shows its node's.
        max_restarts: ``--max-restarts``.
        node_rank: this node's rank in the attempt (``GROUP_RANK``; it can change between attempts).
        num_nodes: the nodes in the attempt (``GROUP_WORLD_SIZE``).
        local_world_size: the processes per node (``--nproc-per-node``).
        world_size: the processes in the attempt.
        shares_agent_store: the workers' process group uses the agent's rendezvous store
            (``TORCHELASTIC_USE_AGENT_STORE``; ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` given to torchrun turns it off).

    Raises:
        ValueError: when the nodes run different numbers of processes (Lightning needs ``devices x num_nodes ==
            WORLD_SIZE``).
    """

    run_id: str
    restart_count: int
    max_restarts: int
    node_rank: int
    num_nodes: int
    local_world_size: int
    world_size: int
    shares_agent_store: bool = False

    def __post_init__(self) -> None:
        if self.local_world_size * self.num_nodes != self.world_size:
            raise ValueError(
                f"TorchrunAttempt: WORLD_SIZE={self.world_size} is not LOCAL_WORLD_SIZE={self.local_world_size} x "
                f"GROUP_WORLD_SIZE={self.num_nodes}: start every node with the same --nproc-per-node (Lightning's "
                "devices x num_nodes must equal the world size)."
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TorchrunAttempt:
        """This process's attempt, read from ``env`` (``os.environ`` when ``None``).

        Raises:
            ValueError: outside torchrun, naming the first variable missing.
        """
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for field, variable in _VARIABLES.items():
            if variable not in env:
                raise ValueError(
                    f"TorchrunAttempt: the variable {variable} is not set: start the script with torchrun "
                    "(e.g. torchrun --nnodes=2:3 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT "
                    "--rdzv-id=JOB --max-restarts=3 train.py)."
                )
            values[field] = env[variable] if field == "run_id" else int(env[variable])
        return cls(**values, shares_agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True")

    @property
    def trainer_kwargs(self) -> dict[str, int]:
        """The Trainer's ``devices`` and ``num_nodes`` for this attempt."""
        return {"devices": self.local_world_size, "num_nodes": self.num_nodes}


def attempt_reason(attempt: TorchrunAttempt, saved: Mapping[str, Any] | None) -> str:
    """Why this attempt runs, from its membership and the one the checkpoint it resumes was written with.

    Args:
        attempt: this attempt.
        saved: :meth:`TorchrunRestarts.state_dict` of the checkpoint's attempt (``None``: no checkpoint).

    Example::

        >>> attempt = TorchrunAttempt("job", 2, 3, 0, 2, 1, 2)
        >>> attempt_reason(attempt, None), attempt_reason(attempt, {"world_size": 3, "restart_count": 1})
        ('restart 2 after a failure, no checkpoint yet', 'a node left or failed (world size 3 -> 2)')
        >>> attempt_reason(attempt, {"world_size": 2, "restart_count": 1})
        'a worker failed (restart 2 of 3)'
    """
    if saved is None:
        if attempt.restart_count == 0:
            return "first start"
        return f"restart {attempt.restart_count} after a failure, no checkpoint yet"
    before = int(saved["world_size"])
    if attempt.world_size > before:
        return f"a node joined (world size {before} -> {attempt.world_size})"
    if attempt.world_size < before:
        return f"a node left or failed (world size {before} -> {attempt.world_size})"
    if attempt.restart_count > int(saved["restart_count"]):
        return f"a worker failed (restart {attempt.restart_count} of {attempt.max_restarts})"
    return "the same membership started again"


class TorchrunRestarts(pl.Callback):
    """Keeps the attempt's membership in the checkpoint and, at the start of training, prints and logs one line:
    the membership, the checkpoint it resumed (epoch, global step, world size) and why this attempt runs.

    Args:
        attempt: this attempt (``None``: :meth:`TorchrunAttempt.from_env`).
        exit_on_sigterm: from the start of training until its end, the agent's SIGTERM ends this worker at once
            (exit status 143). The agent sends it to stop an attempt (a node joined, or another worker failed); the
            work since the last checkpoint is lost either way. Under Lightning's own handler (a flag checked
            between batches, and a broadcast from rank 0) ASP workers did not exit, and torchrun waited its 30 s
            before a SIGKILL at every membership change.

    Example::

        >>> attempt = TorchrunAttempt("job", 0, 3, 1, 3, 1, 3)
        >>> restarts = TorchrunRestarts(attempt)
        >>> restarts.load_state_dict({"world_size": 2, "num_nodes": 2, "restart_count": 0, "run_id": "job"})
        >>> restarts.describe(epoch=2, global_step=64)
        "torchrun job 'job': 3 nodes x 1 process = world size 3, resumed at epoch 2, global step 64 from a checkpoint of world size 2: a node joined (world size 2 -> 3); 0 of 3 restarts after failures used"

    Notes:
        Lightning needs the same ``devices x num_nodes`` as the attempt's world size: pass
        ``**attempt.trainer_kwargs`` to the Trainer. The checkpoint directory must be one every node reads (the node
        of rank 0, which writes it, can change between attempts).
    """

    def __init__(self, attempt: TorchrunAttempt | None = None, exit_on_sigterm: bool = True) -> None:
        self.attempt = TorchrunAttempt.from_env() if attempt is None else attempt
        self.exit_on_sigterm = exit_on_sigterm
        self.saved: dict[str, Any] | None = None
        self.record: dict[str, Any] | None = None
        self._previous_handler: Any = None

    def state_dict(self) -> dict[str, Any]:
        state = asdict(self.attempt)
        return {key: state[key] for key in ("run_id", "restart_count", "num_nodes", "world_size")}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.saved = dict(state_dict)

    def describe(self, epoch: int, global_step: int) -> str:
        """This attempt's line, resumed at ``epoch`` and ``global_step`` (also kept in :attr:`record`)."""
        attempt, saved = self.attempt, self.saved
        processes = "process" if attempt.local_world_size == 1 else "processes"
        where = (
            "from scratch"
            if saved is None
            else f"resumed at epoch {epoch}, global step {global_step} from a checkpoint of world size "
            f"{saved['world_size']}"
        )
        reason = attempt_reason(attempt, saved)
        self.record = {
            **asdict(attempt),
            "epoch": epoch,
            "global_step": global_step,
            "checkpoint_world_size": None if saved is None else saved["world_size"],
            "reason": reason,
        }
        return (
            f"torchrun job {attempt.run_id!r}: {attempt.num_nodes} nodes x {attempt.local_world_size} {processes} = "
            f"world size {attempt.world_size}, {where}: {reason}; {attempt.restart_count} of "
            f"{attempt.max_restarts} restarts after failures used"
        )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        rank_zero_info(self.describe(trainer.current_epoch, trainer.global_step))
        if self.attempt.shares_agent_store:
            rank_zero_warn(
                "TorchrunRestarts: the workers use torchrun's shared rendezvous store "
                "(TORCHELASTIC_USE_AGENT_STORE=True): a node that joins a running job then waits for the store's "
                "address until the rendezvous times out (torch's c10d rendezvous publishes it only at the first "
                "round); start torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in its environment."
            )
        if self.exit_on_sigterm:
            self._previous_handler = signal.signal(signal.SIGTERM, _exit_at_once)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._previous_handler is not None and signal.getsignal(signal.SIGTERM) is _exit_at_once:
            signal.signal(signal.SIGTERM, self._previous_handler)
        self._previous_handler = None


def _exit_at_once(signum: int, frame: Any) -> None:
    os._exit(128 + signum)
