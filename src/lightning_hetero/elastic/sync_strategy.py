"""``ElasticHeteroBatchStrategy``: synchronous training with a constant global batch, split by speed over the workers
present, whose workers leave and join a running job, on torchft.

Each worker is its own process (``python train.py`` per machine, one device each) with this strategy; the workers
find each other through torchft's lighthouse. The Lightning glue only: the steps' arithmetic is
:mod:`lightning_hetero.elastic.sync_steps`, the membership :mod:`lightning_hetero.elastic.membership`. See
``docs/elastic.md``.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from torch.distributed import ReduceOp
from torch.nn.utils import parameters_to_vector
from torch.utils.data import DataLoader, RandomSampler, Sampler, SequentialSampler

from lightning_hetero._lightning_internals import advance_current_epoch, set_current_epoch, set_global_step
from lightning_hetero._validation import check_range
from lightning_hetero.elastic.commits import CommitRecord, digest
from lightning_hetero.elastic.membership import LIGHTHOUSE_ENV, ElasticError, Membership, start_lighthouse
from lightning_hetero.elastic.membership import wait_reachable as _wait_reachable
from lightning_hetero.elastic.signature import model_signature, signature_mismatch
from lightning_hetero.elastic.sync_steps import StepPlan, SyncSteps

#: the checkpoint's key for the elastic state (a plain Lightning checkpoint otherwise)
CHECKPOINT_KEY = "elastic_hetero_batch"


class StepSampler(Sampler[list[int]]):
    """The training loader's batches: one placeholder per step of the epoch, of the global batch's length (what
    Lightning logs per step). The samples of a step are known only after its quorum, so the strategy fetches them
    itself; Lightning's loop fetches one batch ahead, so a placeholder is yielded only while the committed steps
    plus those yielded and not run yet leave a chunk of the epoch.

    Args:
        steps: this worker's steps (the ledger's epoch and committed steps).
        join: called before an epoch's first batch (the worker joins the job there if it has not yet).
    """

    def __init__(self, steps: SyncSteps, join: Callable[[], None]) -> None:
        self.steps = steps
        self.join = join
        #: placeholders yielded and not run yet
        self.pending = 0

    def __iter__(self) -> Iterator[list[int]]:
        self.join()
        steps = self.steps
        epoch = steps.ledger.epoch
        self.pending = 0
        while steps.ledger.epoch == epoch and steps.steps_done + self.pending < steps.ledger.num_chunks:
            self.pending += 1
            yield list(range(steps.chunk_samples(steps.steps_done + self.pending - 1)))

    def consume(self) -> None:
        self.pending = max(0, self.pending - 1)


class ElasticHeteroBatchStrategy(SingleDeviceStrategy):
    """Synchronous data-parallel training on one device per worker with a constant global batch, with workers that
    leave and join while the job runs (torchft).

    Every step trains one global batch (the training loader's ``batch_size``), split over the workers present in
    proportion to their measured speeds, and applies the exact gradient of that batch on every worker. A step
    commits only where every participant finished; a step that fails (a worker lost) is trained again under the new
    membership. A worker started later joins at the next step with the job's state fetched from a peer. Every sample
    is trained once per epoch.

    Args:
        lighthouse: torchft's lighthouse, ``http://host:port`` (default: the ``TORCHFT_LIGHTHOUSE`` variable).
        start_lighthouse: start the lighthouse in this worker at ``lighthouse``'s port (the first worker's node; the
            job then ends when this worker does).
        replica_id: this worker's name in the job (default: ``hostname-pid``).
        min_workers: steps commit only with at least this many workers; a quorum that does not reach it within
            ``step_timeout_s`` ends the worker with an error naming both.
        startup_timeout_s: how long a starting worker waits for the lighthouse to accept connections.
        step_timeout_s: how long a step's quorum and collectives may wait for the others (longer than validation).
        join_timeout_s: after a worker was lost, how long the hosted lighthouse waits for live workers that have not
            reached the step's quorum before it forms the step without them (longer than a step).
        heartbeat_timeout_s: a worker silent this long is dropped (hosted lighthouse), and the lighthouse
            unreachable this long during a quorum ends the worker with an error naming it.
        device: this worker's device.
        **kwargs: passed to ``SingleDeviceStrategy``.

    Example::

        >>> strategy = ElasticHeteroBatchStrategy(lighthouse="http://node0:29510", min_workers=2)
        >>> strategy.lighthouse, strategy.min_workers
        ('http://node0:29510', 2)

    Notes:
        The training loader's ``batch_size`` is the global batch, the same on every worker, and its sampler a plain
        random or sequential one. Each step's samples are fetched in the training process (the loader's
        ``num_workers`` are not used). One optimizer, no gradient accumulation, an optimizer whose ``step`` calls
        its closure once.
    """

    strategy_name = "elastic_hetero_batch"

    def __init__(
        self,
        lighthouse: str | None = None,
        start_lighthouse: bool = False,
        replica_id: str | None = None,
        min_workers: int = 1,
        startup_timeout_s: float = 30.0,
        step_timeout_s: float = 60.0,
        join_timeout_s: float = 2.0,
        heartbeat_timeout_s: float = 2.0,
        device: torch.device | str = "cpu",
        **kwargs: Any,
    ) -> None:
        if importlib.util.find_spec("torchft") is None:
            raise ImportError("ElasticHeteroBatchStrategy needs torchft: pip install 'lightning-hetero[elastic]'")
        super().__init__(device=torch.device(device), **kwargs)
        lighthouse = lighthouse or os.environ.get(LIGHTHOUSE_ENV)
        if not lighthouse:
            raise ValueError(f"ElasticHeteroBatchStrategy needs lighthouse='http://host:port' or {LIGHTHOUSE_ENV}")
        check_range("min_workers", min_workers, low=1, integer=True)
        for name, value in (
            ("startup_timeout_s", startup_timeout_s),
            ("step_timeout_s", step_timeout_s),
            ("join_timeout_s", join_timeout_s),
            ("heartbeat_timeout_s", heartbeat_timeout_s),
        ):
            check_range(name, value, low=0, low_open=True)
        if join_timeout_s >= step_timeout_s:
            raise ValueError(
                f"join_timeout_s={join_timeout_s:g} must be below step_timeout_s={step_timeout_s:g}: the quorum "
                "of the workers present would time out while the lighthouse still waits for a lost one"
            )
        self.lighthouse = lighthouse
        self.start_lighthouse = start_lighthouse
        self.replica_id = replica_id or f"{socket.gethostname()}-{os.getpid()}"
        self.min_workers = min_workers
        self.startup_timeout_s = startup_timeout_s
        self.step_timeout_s = step_timeout_s
        self.join_timeout_s = join_timeout_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        #: this worker's steps (``None`` until the training loader is known)
        self.steps: SyncSteps | None = None
        self.membership: Membership | None = None
        #: what the worker saw: ``joined_s`` (start to its join step), ``recovered`` (state fetched from a peer),
        #: ``failed_steps`` (trained again under the next quorum), ``diverged_steps`` (refused: two histories met),
        #: ``duplicates`` (0 unless something is wrong), ``samples`` (this worker's, in committed steps)
        self.report: dict[str, Any] = {
            "recovered": False,
            "failed_steps": 0,
            "diverged_steps": 0,
            "duplicates": 0,
            "samples": 0,
        }
        #: called with a :class:`~lightning_hetero.elastic.CommitRecord` per step this worker commits
        self.on_commit: Callable[[CommitRecord], None] | None = None
        self._lighthouse_server: Any = None
        self._sampler: StepSampler | None = None
        self._data: tuple[Any, Callable[[list[Any]], Any]] | None = None
        self._local_batch: Any = None
        self._restored: dict[str, Any] | None = None
        self._parent = ""
        self._joined = False
        self._started = time.monotonic()

    # ------------------------------------------------------------------ setup and teardown

    def setup(self, trainer: Any) -> None:
        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        if trainer.accumulate_grad_batches != 1 or len(self.optimizers) != 1:
            raise ValueError(
                "ElasticHeteroBatchStrategy needs one optimizer and accumulate_grad_batches=1, got "
                f"{len(self.optimizers)} optimizer(s) and accumulate_grad_batches={trainer.accumulate_grad_batches}"
            )
        if self.start_lighthouse:
            self._lighthouse_server = start_lighthouse(
                self.lighthouse, self.min_workers, self.join_timeout_s, self.heartbeat_timeout_s
            )
        _wait_reachable(self.lighthouse, self.startup_timeout_s)
        self.membership = Membership(
            self.lighthouse,
            self.replica_id,
            self._load_peer_state,
            self._peer_state,
            round_timeout_s=self.step_timeout_s,
            lost_after_s=self.heartbeat_timeout_s,
            min_workers=self.min_workers,
        )
        rank_zero_info(
            f"ElasticHeteroBatchStrategy: worker {self.replica_id}, lighthouse {self.lighthouse} "
            f"({'started here' if self.start_lighthouse else 'given'}), min_workers={self.min_workers}"
        )

    def process_dataloader(self, dataloader: object) -> object:
        """The training loader becomes one placeholder batch per step (:class:`StepSampler`); its dataset and collate
        function give each step's samples."""
        trainer = self.lightning_module.trainer
        if (
            trainer.state.fn != TrainerFn.FITTING
            or trainer.state.stage != RunningStage.TRAINING
            or not isinstance(dataloader, DataLoader)
        ):
            return dataloader
        sampler = dataloader.sampler
        if dataloader.batch_size is None or not isinstance(sampler, (RandomSampler, SequentialSampler)):
            raise ValueError(
                "ElasticHeteroBatchStrategy needs a training DataLoader with a batch_size (the global batch) and a "
                "plain random or sequential sampler: each step splits a global batch of the epoch's order"
            )
        if self.steps is None:
            shuffle = isinstance(sampler, RandomSampler)
            self.steps = SyncSteps(len(dataloader.dataset), dataloader.batch_size, shuffle, seed=0)  # type: ignore[arg-type]
        self._data = (dataloader.dataset, dataloader.collate_fn)
        self._sampler = StepSampler(self.steps, self._epoch_start)
        return DataLoader(range(dataloader.batch_size), batch_sampler=self._sampler, collate_fn=torch.tensor)

    def on_train_start(self) -> None:
        """Join the job (unless the loader's first batch did already) and start at its epoch and step."""
        super().on_train_start()
        self._join()
        steps = self._parts()
        trainer = self.lightning_module.trainer
        if trainer.current_epoch != steps.ledger.epoch:
            set_current_epoch(trainer, steps.ledger.epoch)
        set_global_step(trainer, steps.steps_total, in_step=False)

    def _epoch_start(self) -> None:
        """Before an epoch's first batch: join the job if not yet, and start at the ledger's epoch (a worker that
        fetched the job's state after the others finished epochs without it)."""
        if not self._joined:
            self._join()
            return
        steps = self._parts()
        trainer = self.lightning_module.trainer
        if steps.ledger.epoch > trainer.current_epoch:
            advance_current_epoch(trainer, steps.ledger.epoch - trainer.current_epoch)

    def _join(self) -> None:
        """The join step, once: a share of 0 in the job's next step (its quorum fetches the job's state from a peer
        when the job is running). A worker that joined a committed step did not apply it: it counts itself one step
        behind, and fetches the state again at its first step."""
        if self._joined:
            return
        self._joined = True
        steps = self._parts()
        assert self.membership is not None
        if self._restored is not None:
            steps.load_state_dict(self._restored["steps"])
            self.membership.restore_step(int(self._restored["step"]))
            self._restored = None
        steps.joining = True
        while True:
            plan, summed = self._attempt(closure=None)
            if plan is not None and (plan.empty or summed is not None):
                break
        steps.joining = False
        if summed is not None:
            self.membership.fall_behind()
        self.report["joined_s"] = time.monotonic() - self._started

    def teardown(self) -> None:
        self._joined = False
        if self.membership is not None:
            self.membership.shutdown()
            self.membership = None
        if self._lighthouse_server is not None:
            self._lighthouse_server.shutdown()
            self._lighthouse_server = None
        super().teardown()

    # ------------------------------------------------------------------ steps

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """The module's training step on this worker's share of the step's global batch (not the placeholder)."""
        if self._local_batch is not None:
            args = (self._local_batch, *args[1:])
        return super().training_step(*args, **kwargs)

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        """One committed step: Lightning's optimizer step around a closure that trains this worker's share and leaves
        the global batch's gradient in ``.grad`` (after as many attempts as it takes to commit one)."""
        steps = self._parts()
        assert self._sampler is not None
        self._sampler.consume()
        committed: list[tuple[StepPlan, Any]] = []

        def synchronous_closure() -> Any:
            while True:
                output: list[Any] = []
                plan, summed = self._attempt(closure, output)
                if plan is not None and summed is not None:
                    committed.append((plan, summed))
                    return output[0] if output else None

        result = super().optimizer_step(optimizer, synchronous_closure, model, **kwargs)
        plan, summed = committed[-1]
        outcome = steps.commit(summed, plan)
        self.report["duplicates"] += outcome.duplicates
        self.report["samples"] += len(plan.indices)
        if self.on_commit is not None:
            assert self.membership is not None
            epoch = plan.epoch
            own = (plan.chunk,) if plan.indices else ()
            step = self.membership.step
            record = CommitRecord(epoch, step, own, (plan.chunk,), self._parent, digest(self._flat()), outcome.samples)
            self.on_commit(record)
        set_global_step(self.lightning_module.trainer, steps.steps_total, in_step=True)
        return result

    def _attempt(
        self, closure: Callable[[], Any] | None, output: list[Any] | None = None
    ) -> tuple[StepPlan | None, torch.Tensor | None]:
        """One try at a step: the quorum, the exchange, this worker's share trained (``closure``; ``None``: the join
        step, a share of 0), the gradient all-reduce and the commit vote. Returns the plan (``None``: the exchange
        failed) and the summed gradient message (``None``: the step did not commit). On a commit the global batch's
        gradient is in ``.grad`` and the float buffers hold the step's weighted mean."""
        steps = self._parts()
        membership = self.membership
        assert membership is not None
        params, buffers = self._params(), self._float_buffers()
        size = sum(p.numel() for p in params) + sum(b.numel() for b in buffers) + 1
        planned: list[StepPlan] = []

        def message(rank: int, participants: int) -> torch.Tensor:
            manager = membership.manager
            exchanged = steps.exchange_message(rank, participants)
            manager.allreduce(exchanged, reduce_op=ReduceOp.SUM).wait()
            if manager.errored() is not None:
                return torch.zeros(size)
            plan = steps.plan(exchanged, rank, participants)
            planned.append(plan)
            if self.on_commit is not None:  # after the quorum: a worker behind has its peer's parameters now
                self._parent = digest(self._flat())
            if plan.empty or plan.diverged:  # nothing is to commit: every participant reports it, the vote fails
                manager.report_error(ElasticError("a step with nobody training or two histories"))
                return torch.zeros(size)
            if closure is not None:
                self._train_share(closure, plan, output)
            # on the CPU: torchft's group is gloo's (a model on a GPU pays one copy per step each way)
            grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
            flat_buffers = torch.cat([b.detach().reshape(-1) for b in buffers]).cpu() if buffers else None
            return steps.message(grads.detach().cpu(), flat_buffers, plan)

        summed, _, _ = membership.round(message)
        plan = planned[-1] if planned else None
        if plan is not None and plan.diverged:
            self.report["diverged_steps"] += 1
            if plan.behind:
                membership.fall_behind()
        elif summed is None and not (plan is not None and plan.empty):
            self.report["failed_steps"] += 1
        if summed is not None and plan is not None and closure is not None:
            self._apply(summed, params, buffers)
        return plan, summed

    def _train_share(self, closure: Callable[[], Any], plan: StepPlan, output: list[Any] | None) -> None:
        """Lightning's closure (zero_grad, training_step, backward) on this worker's share; a share of 0 (more
        workers than samples) still runs it, on one sample whose gradient counts 0, as Lightning requires."""
        assert self._data is not None
        dataset, collate = self._data
        indices = plan.indices or self.steps.chunk_indices(plan.epoch, plan.chunk)[:1]  # type: ignore[union-attr]
        self._local_batch = self.batch_to_device(collate([dataset[i] for i in indices]))
        start = time.perf_counter()
        try:
            result = closure()
        finally:
            self._local_batch = None
        if plan.indices:
            self._parts().record(len(plan.indices), time.perf_counter() - start)
        if output is not None:
            output[:] = [result]

    def _apply(self, summed: torch.Tensor, params: list[torch.Tensor], buffers: list[torch.Tensor]) -> None:
        offset = 0
        with torch.no_grad():
            for tensor in params:
                value = summed[offset : offset + tensor.numel()].view_as(tensor)
                tensor.grad = value.to(tensor.device, tensor.dtype, copy=True)
                offset += tensor.numel()
            for buffer in buffers:
                buffer.copy_(summed[offset : offset + buffer.numel()].view_as(buffer))
                offset += buffer.numel()

    # ------------------------------------------------------------------ the state a joining worker fetches

    def _peer_state(self) -> dict[str, Any]:
        """Served to a recovering peer (during this worker's quorum, between steps): the parameters, float buffers,
        the optimizer's state, the steps' state (the ledger)."""
        return {
            "signature": model_signature(self.lightning_module),
            "params": self._flat().cpu().clone(),
            "buffers": [b.detach().cpu().clone() for b in self._float_buffers()],
            "optimizer": copy.deepcopy(self.optimizers[0].state_dict()),
            "steps": copy.deepcopy(self._parts().state_dict()),
        }

    def _load_peer_state(self, state: dict[str, Any]) -> None:
        mismatch = signature_mismatch(model_signature(self.lightning_module), state["signature"])
        if mismatch is not None:
            raise ElasticError(f"this worker cannot join the elastic job: its model differs: {mismatch}")
        self._parts().load_state_dict(state["steps"])
        flat = state["params"].to(self.root_device)
        with torch.no_grad():
            offset = 0
            for param in self._params():
                param.copy_(flat[offset : offset + param.numel()].view_as(param))
                offset += param.numel()
            for buffer, value in zip(self._float_buffers(), state["buffers"], strict=True):
                buffer.copy_(value)
        self.optimizers[0].load_state_dict(state["optimizer"])
        self.report["recovered"] = True

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        if self.steps is not None and self.membership is not None:
            checkpoint[CHECKPOINT_KEY] = {"steps": self.steps.state_dict(), "step": self.membership.step}
        super().save_checkpoint(checkpoint, filepath, storage_options)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        # Lightning before 2.4 takes no weights_only (its Trainer passes none)
        checkpoint = super().load_checkpoint(checkpoint_path, *(() if weights_only is None else (weights_only,)))
        self._restored = checkpoint.get(CHECKPOINT_KEY)
        return checkpoint

    # ------------------------------------------------------------------ helpers

    def _parts(self) -> SyncSteps:
        if self.steps is None:
            raise ElasticError("ElasticHeteroBatchStrategy found no training DataLoader to split among the workers")
        return self.steps

    def _params(self) -> list[torch.nn.Parameter]:
        return [p for p in self.lightning_module.parameters() if p.requires_grad]

    def _float_buffers(self) -> list[torch.Tensor]:
        return [b for b in self.lightning_module.buffers() if b.is_floating_point()]

    def _flat(self) -> torch.Tensor:
        return parameters_to_vector(self._params()).detach()
