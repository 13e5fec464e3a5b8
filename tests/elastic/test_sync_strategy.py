"""ElasticHeteroBatchStrategy end to end: one worker in this process, and a job of separate worker processes
(``examples/elastic/elastic_worker.py --sync``) that leave, come back and join."""

from __future__ import annotations

import collections
import importlib.util
import subprocess
import time

import lightning as L
import pytest
import torch
from benchmarks.elastic_job import SYNC, ElasticJob, free_port
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_hetero.elastic import (
    CommitRecord,
    ElasticError,
    ElasticHeteroBatchAdvanced,
    ElasticHeteroBatchStrategy,
    epoch_coverage,
)
from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule
from tests.elastic.helpers import cpu_trainer

SAMPLES, BATCH = 200, 16
CHUNKS = -(-SAMPLES // BATCH)


def _chunk_samples(chunk: int) -> int:
    return min(BATCH, SAMPLES - chunk * BATCH)


def _data(shuffle: bool = True) -> SyntheticClassificationDataModule:
    return SyntheticClassificationDataModule(num_samples=SAMPLES, batch_size=BATCH, shuffle=shuffle)


def test_one_worker_trains_each_global_batch_once_per_epoch_as_plain_training_does_and_resumes(tmp_path):
    """Alone, a worker trains every global batch once per epoch, whole, with the same parameters as Lightning's own
    single-device training on the same batches in the same order (the strategy's gradient is the global batch's);
    its checkpoint resumes the job, with or without torchft."""
    strategy = ElasticHeteroBatchStrategy(lighthouse=f"http://localhost:{free_port()}", start_lighthouse=True)
    records: list[CommitRecord] = []
    strategy.on_commit = records.append
    L.seed_everything(0)
    model = MLPClassifier(hidden=16)
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer = cpu_trainer(strategy, 2, default_root_dir=tmp_path, callbacks=[checkpoint], enable_checkpointing=True)
    trainer.fit(model, datamodule=_data(shuffle=False))
    assert [r.round_chunks[0] for r in records] == list(range(CHUNKS)) * 2
    assert [r.samples for r in records] == [_chunk_samples(c) for c in range(CHUNKS)] * 2
    assert trainer.global_step == 2 * CHUNKS and trainer.current_epoch == 2
    assert strategy.report["failed_steps"] == 0 and strategy.report["duplicates"] == 0

    L.seed_everything(0)
    plain = MLPClassifier(hidden=16)
    cpu_trainer("auto", 2, default_root_dir=tmp_path).fit(plain, datamodule=_data(shuffle=False))
    for ours, theirs in zip(model.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs)

    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert saved["elastic_hetero_batch"]["steps"]["ledger"]["epoch"] == 2
    cpu_trainer("auto", 3, default_root_dir=tmp_path).fit(
        MLPClassifier(hidden=16), datamodule=_data(), ckpt_path=tmp_path / "last.ckpt"
    )
    resumed = ElasticHeteroBatchStrategy(lighthouse=f"http://localhost:{free_port()}", start_lighthouse=True)
    again = cpu_trainer(resumed, 3, default_root_dir=tmp_path)
    again.fit(MLPClassifier(hidden=16), datamodule=_data(shuffle=False), ckpt_path=tmp_path / "last.ckpt")
    assert again.current_epoch == 3 and resumed.steps.ledger.epoch == 3 and again.global_step == 3 * CHUNKS


def test_min_workers_not_met_ends_the_worker_with_an_error_naming_it():
    strategy = ElasticHeteroBatchStrategy(
        lighthouse=f"http://localhost:{free_port()}",
        start_lighthouse=True,
        min_workers=2,
        step_timeout_s=3,
        advanced=ElasticHeteroBatchAdvanced(join_timeout_s=1),
    )
    start = time.monotonic()
    with pytest.raises(ElasticError, match=r"no quorum of min_workers=2 through the torchft lighthouse .* within 3 s"):
        cpu_trainer(strategy, 1).fit(MLPClassifier(hidden=16), datamodule=_data())
    assert time.monotonic() - start < 60  # gave up, no hang (a wide margin)


def test_settings_and_loaders_are_checked_by_name(monkeypatch):
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    with pytest.raises(ValueError, match="TORCHFT_LIGHTHOUSE"):
        ElasticHeteroBatchStrategy()
    with pytest.raises(ValueError, match="min_workers"):
        ElasticHeteroBatchStrategy(lighthouse="http://h:1", min_workers=0)
    with pytest.raises(ValueError, match="join_timeout_s=10 must be below step_timeout_s=10"):
        ElasticHeteroBatchStrategy(
            lighthouse="http://h:1", step_timeout_s=10, advanced=ElasticHeteroBatchAdvanced(join_timeout_s=10)
        )
    strategy = ElasticHeteroBatchStrategy(lighthouse=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ValueError, match="accumulate_grad_batches=2"):
        cpu_trainer(strategy, 1, accumulate_grad_batches=2).fit(MLPClassifier(hidden=16), datamodule=_data())


def _trains(job: ElasticJob, proc: subprocess.Popen, after: int = 0, timeout_s: float = 120) -> None:
    """Wait until process ``proc`` has trained samples in more than ``after`` committed steps."""
    deadline = time.monotonic() + timeout_s
    while sum(1 for row in job.commits() if row["pid"] == proc.pid and row["own_samples"]) <= after:
        assert proc.poll() is None, f"worker {proc.pid} exited with {proc.returncode}: {job.errors()}"
        assert time.monotonic() < deadline, f"worker {proc.pid} trained nothing within {timeout_s} s"
        time.sleep(0.2)


def _results(job: ElasticJob) -> dict[str, dict]:
    return {result["name"]: result for result in job.results()}


@pytest.mark.multiprocess
def test_workers_killed_restarted_and_added_keep_the_global_batch_the_ledger_and_one_state(tmp_path):
    """A (hosting the lighthouse), B and C at different speeds; B is killed mid-run and restarted, D added, and two
    workers whose model or data differ are refused. Every committed step of the job's history trained exactly its
    global batch (each participant counting its own samples), every epoch trained each global batch once, the
    finished workers hold the same parameters, and a restarted or added worker trained from a peer's state."""
    stop = tmp_path / "stop"
    job = ElasticJob(tmp_path, [*SYNC, "--samples", str(SAMPLES), "--batch-size", str(BATCH), "--stop-file", str(stop)])
    try:
        a = job.start("a", "--step-sleep-s", "0.01", host=True)
        b = job.start("b", "--step-sleep-s", "0.02")
        c = job.start("c", "--step-sleep-s", "0.04")
        for proc in (a, b, c):
            _trains(job, proc, after=3)
        job.kill("b")
        trained_by_a = sum(1 for row in job.commits() if row["pid"] == a.pid and row["own_samples"])
        _trains(job, a, after=trained_by_a + 3)  # the job goes on without B
        b2 = job.start("b", "--step-sleep-s", "0.02")
        d = job.start("d")
        other_model = job.start("m", "--hidden", "24")
        other_data = job.start("n", "--batch-size", "8")
        for proc in (b2, d):
            _trains(job, proc)
        assert other_model.wait(timeout=120) != 0 and other_data.wait(timeout=120) != 0
        stop.write_text(str(max(row["epoch"] for row in job.commits()) + 2))
        codes = job.wait(timeout_s=180)
    finally:
        job.close()
    assert codes["a"] == [0] and codes["c"] == [0] and codes["d"] == [0] and codes["b"] == [-9, 0], codes
    errors = job.errors()
    assert len(errors) == 2, errors
    assert any("its model differs: parameter net.0.weight has shape [24, 32] here" in e for e in errors.values())
    assert any("its data differs: global_batch_size is 8 here and 16 in the running job" in e for e in errors.values())
    history = job.history()
    assert [record.step for record in history] == list(range(1, len(history) + 1))
    assert all(record.samples == _chunk_samples(record.round_chunks[0]) for record in history)
    coverage = epoch_coverage(history, CHUNKS)
    assert len(coverage) >= 3
    assert all(epoch == {"trained": CHUNKS, "lost": 0, "duplicated": 0} for epoch in coverage.values()), coverage
    results = _results(job)
    assert len({r["checksum"] for r in results.values()}) == 1, results
    assert results["b"]["report"]["recovered"] and results["d"]["report"]["recovered"]
    assert all(r["report"]["duplicates"] == 0 for r in results.values())
    # the slowest worker's share of a step is below the fastest one's (wide: one step where both trained)
    shared = collections.defaultdict(dict)
    for row in job.commits():
        shared[row["step"], row["digest"]][row["name"]] = row["own_samples"]
    assert any(s.get("a", 0) > s.get("c", BATCH) > 0 for s in shared.values())


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.cuda,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
                pytest.mark.skipif(importlib.util.find_spec("torchft") is None, reason="needs the [elastic] extra"),
            ],
        ),
    ],
)
def test_workers_at_different_speeds_train_as_one_process_does_on_the_same_global_batches(tmp_path, device):
    """Three workers (one hosting the lighthouse; on ``cuda`` they share the GPU), the split by speed changing from
    step to step: their parameters after two epochs are those of Lightning's single-device training on the CPU on
    the same global batches (up to float summation order), so each step's gradient was the global batch's."""
    stop = tmp_path / "stop"
    stop.write_text("2")
    args = ["--samples", str(SAMPLES), "--batch-size", str(BATCH), "--no-shuffle", "--device", device]
    job = ElasticJob(tmp_path, [*SYNC, *args, "--stop-file", str(stop), "--min-workers", "3"])
    try:
        job.start("a", "--step-sleep-s", "0.01", host=True)
        job.start("b", "--step-sleep-s", "0.02")
        job.start("c", "--step-sleep-s", "0.03")
        codes = job.wait(timeout_s=240)
    finally:
        job.close()
    assert codes == {"a": [0], "b": [0], "c": [0]}, (codes, job.errors())
    history = job.history()
    assert len(history) == 2 * CHUNKS and all(r.samples == _chunk_samples(r.round_chunks[0]) for r in history)
    shares = collections.defaultdict(dict)
    for row in job.commits():
        shares[row["step"]][row["name"]] = row["own_samples"]
    assert any(share["a"] > share["c"] + 2 for share in shares.values())  # the fastest trains more (wide margin)
    L.seed_everything(0)
    plain = MLPClassifier(hidden=16)
    cpu_trainer("auto", 2, default_root_dir=tmp_path).fit(plain, datamodule=_data(shuffle=False))
    expected = float(sum(p.detach().double().sum() for p in plain.parameters()))
    checksums = {r["checksum"] for r in job.results()}
    assert len(checksums) == 1 and checksums.pop() == pytest.approx(expected, abs=1e-4 if device == "cpu" else 1e-3)
