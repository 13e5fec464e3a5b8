"""``ElasticLocalSGDStrategy``: speed-proportional local SGD whose workers leave and join a running job, on torchft.

Each worker is its own process (``python train.py`` per machine, one device each) with this strategy; the workers
find each other through torchft's lighthouse. The Lightning glue only: the rounds are
:mod:`lightning_hetero.elastic.rounds`, the membership :mod:`lightning_hetero.elastic.membership`. See
``docs/elastic.md``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from torch.nn.utils import vector_to_parameters
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from lightning_hetero._lightning_internals import advance_current_epoch, set_current_epoch, set_global_step
from lightning_hetero._validation import check_range
from lightning_hetero.elastic.commits import CommitRecord, digest
from lightning_hetero.elastic.connection import JobConnection
from lightning_hetero.elastic.membership import ElasticError
from lightning_hetero.elastic.rounds import ElasticRounds
from lightning_hetero.elastic.sampler import IDLE, ElasticBatchSampler, elastic_loader
from lightning_hetero.elastic.settings import (
    DEFAULT_ROUND_LENGTH,
    ElasticLocalSGDAdvanced,
    moved_attribute,
    old_keywords,
)
from lightning_hetero.elastic.signature import (
    check_joining_model,
    flat_params,
    float_buffers,
    model_signature,
    trainable_params,
)
from lightning_hetero.local_sgd.outer_optimizer import OuterOptimizer

#: the checkpoint's key for the elastic state (a plain Lightning checkpoint otherwise)
CHECKPOINT_KEY = "elastic_local_sgd"


class ElasticLocalSGDStrategy(SingleDeviceStrategy):
    """Local SGD on one device per worker, with workers that leave and join while the job runs (torchft).

    Every worker trains its own copy for a round (its local steps in proportion to its measured speed), then the
    workers present combine their pseudo-gradients in one all-reduce and an outer optimizer applies them. A worker
    that dies is dropped at the next round end; one started later joins at the next round end with the state fetched
    from a peer and trains from its first round. Every sample is trained once per epoch by the workers present.

    Args:
        lighthouse: torchft's lighthouse, ``http://host:port`` (default: the ``TORCHFT_LIGHTHOUSE`` variable).
        start_lighthouse: start the lighthouse in this worker at ``lighthouse``'s port (the first worker's node; the
            job then ends when this worker does).
        replica_id: this worker's name in the job (default: ``hostname-pid``).
        round_length: the round's length: local steps per worker on average (an int), split by speed.
        outer_optimizer: the outer optimizer class (default ``torch.optim.SGD`` with ``lr=1.0``: plain averaging).
        outer_optimizer_kwargs: its keyword arguments.
        min_workers: rounds commit only with at least this many workers.
        round_timeout_s: how long a round end may wait for the others (longer than a round plus validation).
        device: this worker's device.
        advanced: :class:`~lightning_hetero.elastic.ElasticLocalSGDAdvanced`, the expert knobs.
        **kwargs: passed to ``SingleDeviceStrategy`` (and, deprecated, the old keywords: ``steps_per_round``, the
            expert knobs).

    Example::

        >>> strategy = ElasticLocalSGDStrategy(lighthouse="http://node0:29510", start_lighthouse=True)
        >>> strategy.connection.lighthouse, strategy.round_length
        ('http://node0:29510', 16)
    """

    strategy_name = "elastic_local_sgd"

    def __init__(
        self,
        lighthouse: str | None = None,
        start_lighthouse: bool = False,
        replica_id: str | None = None,
        round_length: int = DEFAULT_ROUND_LENGTH,
        outer_optimizer: type[Optimizer] | None = None,
        outer_optimizer_kwargs: dict[str, Any] | None = None,
        min_workers: int = 1,
        round_timeout_s: float = 300.0,
        device: torch.device | str = "cpu",
        advanced: ElasticLocalSGDAdvanced | None = None,
        **kwargs: Any,
    ) -> None:
        round_length, advanced, kwargs = old_keywords(round_length, advanced, kwargs)
        if not isinstance(advanced, ElasticLocalSGDAdvanced):
            raise TypeError(f"advanced must be an ElasticLocalSGDAdvanced, got {type(advanced).__name__}")
        #: the lighthouse, the membership and the job's position in checkpoints
        self.connection = JobConnection(
            "ElasticLocalSGDStrategy",
            CHECKPOINT_KEY,
            "rounds",
            lighthouse,
            start_lighthouse,
            replica_id,
            min_workers,
            advanced.startup_timeout_s,
            round_timeout_s,
            advanced.join_timeout_s,
            advanced.heartbeat_timeout_s,
        )
        super().__init__(device=torch.device(device), **kwargs)
        # an int only: the ledger counts rounds in steps ("<T>s" and "<N> samples" are AsyncPSStrategy's)
        check_range("round_length", round_length, low=1, integer=True)
        #: local steps per worker and round on average
        self.round_length = round_length
        #: the expert knobs, read-only
        self.advanced = advanced
        self.outer = OuterOptimizer(outer_optimizer, outer_optimizer_kwargs)
        #: this worker's rounds (``None`` until the training loader is known)
        self.rounds: ElasticRounds | None = None
        #: what the worker saw: ``joined_s`` (start to first round end), ``recovered`` (state fetched from a peer),
        #: ``failed_rounds``, ``diverged_rounds`` (refused: two histories met), ``duplicates``, ``round_ends`` and ``round_end_s`` (their count and total seconds: the
        #: quorum, the all-reduce and the commit vote, waiting for the others included)
        self.report: dict[str, Any] = {
            "recovered": False,
            "failed_rounds": 0,
            "diverged_rounds": 0,
            "duplicates": 0,
            "round_ends": 0,
            "round_end_s": 0.0,
        }
        #: called with a :class:`~lightning_hetero.elastic.CommitRecord` per round this worker commits
        self.on_commit: Callable[[CommitRecord], None] | None = None
        self._sampler: ElasticBatchSampler | None = None

    def __getattr__(self, name: str) -> Any:
        return moved_attribute(self, name)  # the settings were attributes here (0.2.0), and the old keywords

    # ------------------------------------------------------------------ setup and teardown

    def setup(self, trainer: Any) -> None:
        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        if trainer.accumulate_grad_batches != 1 or len(self.optimizers) != 1:
            raise ValueError(
                "ElasticLocalSGDStrategy needs one optimizer and accumulate_grad_batches=1, got "
                f"{len(self.optimizers)} optimizer(s) and accumulate_grad_batches={trainer.accumulate_grad_batches}"
            )
        self.connection.connect(self._load_peer_state, self._peer_state)
        rank_zero_info(
            f"ElasticLocalSGDStrategy: {self.connection.describe()}, {self.round_length} local steps per worker "
            f"and round split by speed, pseudo_gradient_weighting={self.advanced.pseudo_gradient_weighting!r}, outer "
            f"optimizer {self.outer.description}"
        )

    def process_dataloader(self, dataloader: object) -> object:
        """The training loader's batches become the chunks the ledger assigns to this worker."""
        trainer = self.lightning_module.trainer
        if (
            trainer.state.fn != TrainerFn.FITTING
            or trainer.state.stage != RunningStage.TRAINING
            or not isinstance(dataloader, DataLoader)
        ):
            return dataloader
        num_chunks = -(-len(dataloader.dataset) // (dataloader.batch_size or 1))  # type: ignore[arg-type]
        if self.rounds is None:
            weighting = self.advanced.pseudo_gradient_weighting
            self.rounds = ElasticRounds(num_chunks, self.round_length, self.outer, weighting)
        built = elastic_loader(dataloader, self.rounds, self._epoch_start)
        if built is None:
            raise ValueError(
                "ElasticLocalSGDStrategy needs a training DataLoader with a batch_size and a plain (random or "
                "sequential) sampler: the workers share its batches through the epoch's ledger"
            )
        loader, self._sampler = built
        return loader

    def on_train_start(self) -> None:
        """Join the job (unless the loader's first batch did already, as on a resume) and start at its epoch."""
        super().on_train_start()
        self._join()
        rounds = self._parts()[0]
        trainer = self.lightning_module.trainer
        if trainer.current_epoch != rounds.ledger.epoch:  # joined a running job: start at its epoch
            set_current_epoch(trainer, rounds.ledger.epoch)
        set_global_step(trainer, rounds.steps_total, in_step=False)

    def _epoch_start(self) -> None:
        """Before an epoch's first batch: join the job if not yet, and start at the ledger's epoch (a worker that
        fetched the job's state after the others finished epochs without it, as one left out of rounds while stuck)."""
        if not self.connection.joined:  # the first epoch: on_train_start sets the job's epoch
            self._join()
            return
        rounds = self._parts()[0]
        trainer = self.lightning_module.trainer
        if rounds.ledger.epoch > trainer.current_epoch:
            advance_current_epoch(trainer, rounds.ledger.epoch - trainer.current_epoch)

    def _join(self) -> None:
        """The first round end (this worker's state fetched from a peer when the job is running), once."""
        rounds = self._parts()[0]

        def first_round_end() -> None:
            rounds.begin(self._flat())
            self._round_end()

        joined_s = self.connection.join(rounds.load_state_dict, first_round_end)
        if joined_s is not None:
            self.report["joined_s"] = joined_s

    def teardown(self) -> None:
        self.connection.close()
        super().teardown()

    # ------------------------------------------------------------------ steps and round ends

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        """A local step on this worker's chunk; an idle batch runs the closure only. At the end of the worker's
        quota (or on an idle batch) the round end."""
        rounds, sampler = self._parts()
        chunk = sampler.next_chunk()
        epoch = rounds.ledger.epoch
        if chunk == IDLE or rounds.dropped(chunk):
            output = closure()
            optimizer.zero_grad()
            if epoch == sampler.epoch:  # else the ledger finished this loader iteration's epoch: no more rounds in it
                self._round_end()
        else:
            start = time.perf_counter()
            output = super().optimizer_step(optimizer, closure, model, **kwargs)
            if rounds.record_step(chunk, sampler.chunk_samples(chunk), time.perf_counter() - start):
                self._round_end()
        set_global_step(self.lightning_module.trainer, rounds.steps_total, in_step=True)
        return output

    def _round_end(self, retry: bool = True) -> None:
        """A round that fails (a participant was lost on the way) ends again at once with nothing trained (its chunks
        back in this worker's queue): the job re-forms without the lost worker now, a restarted one joins there."""
        rounds, _ = self._parts()
        membership = self.connection.membership
        assert membership is not None
        flat = self._flat()
        buffers = self._float_buffers()
        flat_buffers = torch.cat([b.detach().reshape(-1) for b in buffers]) if buffers else None
        self._recovered_flat: torch.Tensor | None = None

        def message(rank: int, participants: int) -> torch.Tensor:
            nonlocal flat, flat_buffers
            if self._recovered_flat is not None:  # recovered from a peer in the quorum: start from its state
                flat = self._recovered_flat
                flat_buffers = torch.cat([b.detach().reshape(-1) for b in buffers]) if buffers else None
            return rounds.message(flat, flat_buffers, rank, participants)

        trained = tuple(rounds.trained)
        start = time.perf_counter()
        summed, rank, participants = membership.round(message)
        self.report["round_ends"] += 1
        self.report["round_end_s"] += time.perf_counter() - start
        if summed is None:
            self.report["failed_rounds"] += 1
            rounds.rollback(flat)
            self._set_flat(flat, flat_buffers)
            if retry:
                self._round_end(retry=False)
            return
        parent = digest(rounds.outer.anchor) if self.on_commit is not None else ""
        result = rounds.commit(summed, flat, flat_buffers, rank, participants)
        if result.diverged:  # two histories met: nothing committed (torchft's step, a no-op); the losers recover
            self.report["diverged_rounds"] += 1
            if self.on_commit is not None:
                self.on_commit(CommitRecord(rounds.ledger.epoch, membership.step, (), (), parent, parent))
            if result.behind:
                membership.fall_behind()
            self._set_flat(flat, flat_buffers)
            if retry:
                self._round_end(retry=False)
            return
        self.report["duplicates"] += result.duplicates
        if self.on_commit is not None:
            epoch = rounds.ledger.epoch - int(result.epoch_done)
            own = () if self._recovered_flat is not None else trained
            step = membership.step
            self.on_commit(CommitRecord(epoch, step, own, result.chunks, parent, digest(rounds.outer.anchor)))
        self._set_flat(flat, flat_buffers)

    # ------------------------------------------------------------------ the state a joining worker fetches

    def _peer_state(self) -> dict[str, Any]:
        """Served to a recovering peer (during this worker's quorum): the round's start parameters, buffers, the
        inner optimizer, the rounds' state."""
        rounds, _ = self._parts()
        anchor = rounds.outer.anchor
        assert anchor is not None
        return {
            "signature": model_signature(self.lightning_module),
            "anchor": anchor.clone(),
            "buffers": [b.detach().clone() for b in self._float_buffers()],
            "optimizer": copy.deepcopy(self.optimizers[0].state_dict()) if self.optimizers else None,
            "rounds": copy.deepcopy(rounds.state_dict()),
        }

    def _load_peer_state(self, state: dict[str, Any]) -> None:
        check_joining_model(self.lightning_module, state["signature"])
        rounds, _ = self._parts()
        flat = state["anchor"].to(self.root_device)
        for buffer, value in zip(self._float_buffers(), state["buffers"], strict=True):
            buffer.copy_(value)
        if state["optimizer"] is not None and self.optimizers:
            self.optimizers[0].load_state_dict(state["optimizer"])
        self._set_flat(flat, None)
        rounds.load_state_dict(state["rounds"], flat)
        self._recovered_flat = flat.clone()
        self.report["recovered"] = True

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        self.connection.save(checkpoint, None if self.rounds is None else self.rounds.state_dict)
        super().save_checkpoint(checkpoint, filepath, storage_options)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        # Lightning before 2.4 takes no weights_only (its Trainer passes none)
        checkpoint = super().load_checkpoint(checkpoint_path, *(() if weights_only is None else (weights_only,)))
        self.connection.load(checkpoint)
        return checkpoint

    # ------------------------------------------------------------------ helpers

    def _parts(self) -> tuple[ElasticRounds, ElasticBatchSampler]:
        if self.rounds is None or self._sampler is None:
            raise ElasticError("ElasticLocalSGDStrategy found no training DataLoader to share among the workers")
        return self.rounds, self._sampler

    def _params(self) -> list[torch.nn.Parameter]:
        return trainable_params(self.lightning_module)

    def _float_buffers(self) -> list[torch.Tensor]:
        return float_buffers(self.lightning_module)

    def _flat(self) -> torch.Tensor:
        return flat_params(self.lightning_module)

    def _set_flat(self, flat: torch.Tensor, flat_buffers: torch.Tensor | None) -> None:
        with torch.no_grad():
            vector_to_parameters(flat, self._params())
            if flat_buffers is not None:
                offset = 0
                for buffer in self._float_buffers():
                    buffer.copy_(flat_buffers[offset : offset + buffer.numel()].view_as(buffer))
                    offset += buffer.numel()
