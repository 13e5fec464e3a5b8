"""``ElasticHeteroBatchStrategy``: synchronous training with a constant global batch, split by speed over the workers
present, whose workers leave and join a running job, on torchft.

Each worker is its own process (``python train.py`` per machine, one device each) with this strategy; the workers
find each other through torchft's lighthouse. The Lightning glue only: the steps' arithmetic is
:mod:`lightning_hetero.elastic.sync_steps`, the membership :mod:`lightning_hetero.elastic.membership`. See
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
from torch.distributed import ReduceOp
from torch.utils.data import DataLoader, DistributedSampler

from lightning_hetero._lightning_internals import advance_current_epoch, set_current_epoch, set_global_step
from lightning_hetero.elastic.commits import CommitRecord, digest
from lightning_hetero.elastic.connection import JobConnection
from lightning_hetero.elastic.membership import ElasticError
from lightning_hetero.elastic.sampler import StepSampler
from lightning_hetero.elastic.settings import ElasticHeteroBatchAdvanced, sync_old_keywords
from lightning_hetero.elastic.signature import (
    check_joining_model,
    flat_params,
    float_buffers,
    model_signature,
    trainable_params,
)
from lightning_hetero.elastic.sync_steps import StepPlan, SyncSteps
from lightning_hetero.epoch_order import sampler_order

#: the checkpoint's key for the elastic state (a plain Lightning checkpoint otherwise)
CHECKPOINT_KEY = "elastic_hetero_batch"


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
        step_timeout_s: how long a step's quorum and collectives may wait for the others (longer than validation).
        device: this worker's device.
        advanced: :class:`~lightning_hetero.elastic.ElasticHeteroBatchAdvanced`, the expert knobs (the start-up, join
            and heartbeat timeouts).
        **kwargs: passed to ``SingleDeviceStrategy`` (and, deprecated, the expert knobs' old keywords).

    Example::

        >>> strategy = ElasticHeteroBatchStrategy(lighthouse="http://node0:29510", min_workers=2)
        >>> strategy.connection.lighthouse, strategy.connection.min_workers
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
        step_timeout_s: float = 60.0,
        device: torch.device | str = "cpu",
        advanced: ElasticHeteroBatchAdvanced | None = None,
        **kwargs: Any,
    ) -> None:
        advanced, kwargs = sync_old_keywords(advanced, kwargs)
        if not isinstance(advanced, ElasticHeteroBatchAdvanced):
            raise TypeError(f"advanced must be an ElasticHeteroBatchAdvanced, got {type(advanced).__name__}")
        #: the expert knobs, read-only
        self.advanced = advanced
        #: the lighthouse, the membership and the job's position in checkpoints
        self.connection = JobConnection(
            "ElasticHeteroBatchStrategy",
            CHECKPOINT_KEY,
            "steps",
            lighthouse,
            start_lighthouse,
            replica_id,
            min_workers,
            advanced.startup_timeout_s,
            step_timeout_s,
            advanced.join_timeout_s,
            advanced.heartbeat_timeout_s,
            quorum_timeout_name="step_timeout_s",
            waiting="the quorum",
        )
        super().__init__(device=torch.device(device), **kwargs)
        #: this worker's steps (``None`` until the training loader is known)
        self.steps: SyncSteps | None = None
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
        self._sampler: StepSampler | None = None
        self._data: tuple[Any, Callable[[list[Any]], Any]] | None = None
        self._local_batch: Any = None
        self._parent = ""

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
        self.connection.connect(self._load_peer_state, self._peer_state)
        rank_zero_info(
            f"ElasticHeteroBatchStrategy: {self.connection.describe()}, min_workers={self.connection.min_workers}"
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
        order = sampler_order(dataloader.sampler)
        if dataloader.batch_size is None or order is None or isinstance(dataloader.sampler, DistributedSampler):
            raise ValueError(
                "ElasticHeteroBatchStrategy needs a training DataLoader with a batch_size (the global batch) and a "
                "plain random or sequential sampler: each step splits a global batch of the epoch's order"
            )
        if self.steps is None:
            shuffle, seed = order
            self.steps = SyncSteps(len(dataloader.dataset), dataloader.batch_size, shuffle, seed)  # type: ignore[arg-type]
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
        if not self.connection.joined:
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
        steps = self._parts()

        def join_step() -> None:
            steps.joining = True
            while True:
                plan, summed = self._attempt(closure=None)
                if plan is not None and (plan.empty or summed is not None):
                    break
            steps.joining = False
            if summed is not None:
                assert self.connection.membership is not None
                self.connection.membership.fall_behind()

        joined_s = self.connection.join(steps.load_state_dict, join_step)
        if joined_s is not None:
            self.report["joined_s"] = joined_s

    def teardown(self) -> None:
        self.connection.close()
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
            assert self.connection.membership is not None
            epoch = plan.epoch
            own = (plan.chunk,) if plan.indices else ()
            step = self.connection.membership.step
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
        membership = self.connection.membership
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
        check_joining_model(self.lightning_module, state["signature"])
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
        self.connection.save(checkpoint, None if self.steps is None else self.steps.state_dict)
        super().save_checkpoint(checkpoint, filepath, storage_options)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        # Lightning before 2.4 takes no weights_only (its Trainer passes none)
        checkpoint = super().load_checkpoint(checkpoint_path, *(() if weights_only is None else (weights_only,)))
        self.connection.load(checkpoint)
        return checkpoint

    # ------------------------------------------------------------------ helpers

    def _parts(self) -> SyncSteps:
        if self.steps is None:
            raise ElasticError("ElasticHeteroBatchStrategy found no training DataLoader to split among the workers")
        return self.steps

    def _params(self) -> list[torch.nn.Parameter]:
        return trainable_params(self.lightning_module)

    def _float_buffers(self) -> list[torch.Tensor]:
        return float_buffers(self.lightning_module)

    def _flat(self) -> torch.Tensor:
        return flat_params(self.lightning_module)
