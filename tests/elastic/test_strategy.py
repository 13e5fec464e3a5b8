"""ElasticLocalSGDStrategy end to end: one worker in this process (checkpoints, a lighthouse nobody runs), and a job
of separate worker processes (``examples/elastic/elastic_worker.py``) that leave and join."""

from __future__ import annotations

import time
from pathlib import Path

import lightning as L
import pytest
import torch
from benchmarks.elastic_job import ElasticJob, free_port
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.nn.utils import parameters_to_vector

from lightning_hetero.elastic import ElasticError, ElasticLocalSGDAdvanced, ElasticLocalSGDStrategy
from lightning_hetero.elastic.rounds import ElasticRounds
from lightning_hetero.local_sgd.outer_optimizer import OuterOptimizer
from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule
from tests.elastic.helpers import cpu_trainer

SAMPLES, BATCH = 256, 16
CHUNKS = SAMPLES // BATCH


def _data() -> SyntheticClassificationDataModule:
    return SyntheticClassificationDataModule(num_samples=SAMPLES, batch_size=BATCH)


def test_one_worker_trains_every_batch_and_its_checkpoint_resumes_with_and_without_torchft(tmp_path):
    strategy = ElasticLocalSGDStrategy(lighthouse=f"http://localhost:{free_port()}", start_lighthouse=True)
    trained: list[int] = []
    strategy.on_commit = lambda record: trained.extend(record.chunks)
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    L.seed_everything(0)
    trainer = cpu_trainer(strategy, 2, callbacks=[checkpoint], enable_checkpointing=True)
    trainer.fit(MLPClassifier(hidden=16), datamodule=_data())
    assert sorted(trained) == sorted(list(range(CHUNKS)) * 2)
    assert trainer.global_step == 2 * CHUNKS and strategy.report["failed_rounds"] == 0
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert saved["elastic_local_sgd"]["rounds"]["ledger"]["epoch"] == 2

    plain = cpu_trainer("auto", 3)  # no torchft needed to read it: a plain Lightning checkpoint
    plain.fit(MLPClassifier(hidden=16), datamodule=_data(), ckpt_path=tmp_path / "last.ckpt")
    assert plain.current_epoch == 3

    resumed = ElasticLocalSGDStrategy(lighthouse=f"http://localhost:{free_port()}", start_lighthouse=True)
    again = cpu_trainer(resumed, 3)
    again.fit(MLPClassifier(hidden=16), datamodule=_data(), ckpt_path=tmp_path / "last.ckpt")
    assert again.current_epoch == 3 and resumed.rounds.ledger.epoch == 3
    assert again.global_step == 3 * CHUNKS


def test_a_worker_that_cannot_reach_the_lighthouse_says_so_within_startup_timeout_s():
    address = f"http://127.0.0.1:{free_port()}"
    strategy = ElasticLocalSGDStrategy(lighthouse=address, advanced=ElasticLocalSGDAdvanced(startup_timeout_s=1.0))
    start = time.monotonic()
    with pytest.raises(
        ElasticError, match=rf"cannot reach the torchft lighthouse at {address} within startup_timeout_s=1"
    ):
        cpu_trainer(strategy, 1).fit(MLPClassifier(hidden=16), datamodule=_data())
    assert time.monotonic() - start < 30  # gave up, no hang (a wide margin)


def test_gradient_accumulation_is_refused_naming_the_setting():
    strategy = ElasticLocalSGDStrategy(lighthouse=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ValueError, match="accumulate_grad_batches=2"):
        cpu_trainer(strategy, 1, accumulate_grad_batches=2).fit(MLPClassifier(hidden=16), datamodule=_data())


def test_settings_are_checked_by_name(monkeypatch):
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    with pytest.raises(ValueError, match="TORCHFT_LIGHTHOUSE"):
        ElasticLocalSGDStrategy()
    with pytest.raises(ValueError, match="round_length must be an integer >= 1, got 0"):
        ElasticLocalSGDStrategy(lighthouse="http://h:1", round_length=0)
    with pytest.raises(ValueError, match="round_length must be an integer >= 1, got '30s'"):
        ElasticLocalSGDStrategy(lighthouse="http://h:1", round_length="30s")  # AsyncPSStrategy's units, not here
    with pytest.raises(ValueError, match="weighting"):
        ElasticLocalSGDAdvanced(pseudo_gradient_weighting="median")
    with pytest.raises(ValueError, match="join_timeout_s=10 must be below round_timeout_s=10"):
        ElasticLocalSGDStrategy(
            lighthouse="http://h:1", round_timeout_s=10, advanced=ElasticLocalSGDAdvanced(join_timeout_s=10)
        )
    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", "http://node0:29510")
    strategy = ElasticLocalSGDStrategy(round_timeout_s=20)
    assert strategy.connection.lighthouse == "http://node0:29510"
    with pytest.deprecated_call(match=r"ElasticLocalSGDStrategy.lighthouse is deprecated .*\.connection\.lighthouse"):
        assert strategy.lighthouse == "http://node0:29510"
    with pytest.deprecated_call(match="use ElasticLocalSGDStrategy.connection.quorum_timeout_s"):
        assert strategy.round_timeout_s == 20
    with pytest.raises(AttributeError, match="no attribute 'rounds_total'"):
        strategy.rounds_total


class _FailingOnce:
    """A membership whose first round end fails (a participant lost in the all-reduce), then commits alone."""

    def __init__(self) -> None:
        self.messages: list[torch.Tensor] = []
        self.step = 0

    def round(self, message):
        self.messages.append(message(0, 1).clone())
        return (None if len(self.messages) == 1 else self.messages[-1]), 0, 1


def test_a_failed_round_end_ends_again_at_once_with_nothing_trained_and_keeps_its_chunks():
    """The survivors of a broken round end re-form the job at once (a restarted worker joins there), not after
    training the round's chunks again; those chunks stay this worker's."""
    strategy = ElasticLocalSGDStrategy(lighthouse="http://localhost:1")
    strategy._lightning_module = model = MLPClassifier(hidden=8)
    strategy.rounds = rounds = ElasticRounds(CHUNKS, 2, OuterOptimizer(torch.optim.SGD, {"lr": 1.0}))
    strategy._sampler = object()  # the loader is not used here
    strategy.connection.membership = membership = _FailingOnce()
    start = parameters_to_vector(model.parameters()).detach().clone()
    rounds.begin(start)
    rounds.queue.extend([3, 5])
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    rounds.record_step(rounds.take(), samples=BATCH, step_s=0.1)
    strategy._round_end()
    counts = start.numel() + sum(b.numel() for b in model.buffers() if b.is_floating_point())
    first, second = (m[counts : counts + 3 + CHUNKS].tolist() for m in membership.messages)
    assert first[:3] == [BATCH, 1.0, 1.0] and first[3 + 3] == 1.0  # samples, weight, steps; chunk 3 trained
    assert second == [0.0] * (3 + CHUNKS)  # at once, nothing trained
    assert strategy.report["failed_rounds"] == 1 and strategy.report["round_ends"] == 2
    assert torch.equal(parameters_to_vector(model.parameters()), start)  # the failed round's step is undone
    assert rounds.ledger.counts.sum() == 0 and {3, 5} <= set(rounds.held)  # not trained, still held here


def _wait_for_commit(job: ElasticJob, proc, timeout_s: float = 90.0) -> float:
    """Seconds from starting ``proc`` to its first committed round that trained a chunk."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        since = job.first_contribution_s(proc.pid)
        if since is not None:
            return since
        assert proc.poll() is None, f"worker {proc.pid} exited with {proc.returncode}: {job.errors()}"
        time.sleep(0.2)
    raise AssertionError(f"worker {proc.pid} contributed nothing within {timeout_s} s")


def _stop_after_next_epochs(job: ElasticJob, stop_file: Path, epochs: int) -> None:
    stop_file.write_text(str(max(row["epoch"] for row in job.commits()) + epochs))


def _wait_until(condition, what: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.1)


def _rows(job: ElasticJob, proc) -> list[dict]:
    return [row for row in job.commits() if row["pid"] == proc.pid]


@pytest.mark.multiprocess
@pytest.mark.timing
def test_a_split_job_commits_nothing_where_its_groups_meet_and_workers_leave_join_and_restart(tmp_path):
    """A hosts the lighthouse and commits its join round alone; B and C, started while A is held in its first batch,
    form a group of their own (torchft's lighthouse lets them: A is not at a round end) and commit the same step 1
    from their own ledger, as a job's start split in two. A's next round end waits at the lighthouse, then B and C
    come: the round where the two histories meet at equal steps commits nothing and the losing history recovers
    from the other. Then D (another model) is refused, and B is killed and restarted; no run hangs, the job's history
    trains every batch once per epoch, the survivors agree."""
    stop, go_a, go_bc = tmp_path / "stop", tmp_path / "go-a", tmp_path / "go-bc"
    args = ["--epochs", "1000", "--samples", str(SAMPLES), "--batch-size", str(BATCH), "--step-sleep-s", "0.02"]
    job = ElasticJob(tmp_path, [*args, "--join-timeout-s", "1", "--stop-file", str(stop)])
    try:
        a = job.start("a", "--hold-file", str(go_a), host=True)
        _wait_until(lambda: _rows(job, a), "A's join round")
        b, c = (job.start(name, "--hold-file", str(go_bc)) for name in "bc")
        _wait_until(lambda: _rows(job, b) and _rows(job, c), "B's and C's join round")
        assert [row["step"] for row in job.commits()] == [1, 1, 1]  # two groups committed step 1
        go_a.touch()
        _wait_until(lambda: job.waiting() == 1, "A waiting at the lighthouse")  # B and C are held
        go_bc.touch()
        _wait_for_commit(job, b)
        _wait_for_commit(job, c)
        met = _rows(job, a)[1]  # A's round end after its first round: B or C (or both) met it there at step 1
        d = job.start("d", "--hidden", "48")
        job.kill("b")
        _wait_for_commit(job, job.start("b"))
        assert d.wait(timeout=120) != 0
        _stop_after_next_epochs(job, stop, 2)
        codes = job.wait(timeout_s=120)
    finally:
        job.close()
    assert codes["a"] == [0] and codes["c"] == [0] and codes["b"] == [-9, 0], codes
    assert met["round_chunks"] == [] and met["parent"] == met["digest"]  # the round where they met: nothing committed
    errors = job.errors()
    assert len(errors) == 1
    assert (
        "cannot join the elastic job: its model differs: parameter net.0.weight has shape [48, 32] here and "
        "[32, 32] in the running job" in next(iter(errors.values()))
    )
    coverage = job.coverage(CHUNKS)  # the history the finished workers' parameters descend from
    assert len(coverage) >= 3
    assert all(epoch["lost"] == 0 and epoch["duplicated"] == 0 for epoch in coverage.values()), coverage
    results = {r["name"]: r for r in job.results()}
    assert results["a"]["checksum"] == results["b"]["checksum"] == results["c"]["checksum"]
    assert results["a"]["report"]["diverged_rounds"] >= 1 and results["b"]["report"]["recovered"]
    assert all(r["report"]["duplicates"] == 0 for r in results.values())
