"""Where a local-SGD run's time goes, per rank: ``python -m benchmarks run local_sgd --breakdown``.

:class:`BreakdownRecorder` timestamps batches, round-end all-reduces and chunk claims; :func:`breakdown` sums them
into categories that add up to each rank's epoch spans.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

CATEGORIES = ("compute", "round_wait", "round_sync", "claims", "between_batches", "epoch_edges")


class BreakdownRecorder(Callback):
    """Records one rank's batches, round ends and claims, written to ``<out>.rank<k>.json`` at the end."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.epochs: list[dict[str, Any]] = []
        self._wrapped = False

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        strategy = trainer.strategy
        if not self._wrapped:
            self._wrapped = True
            self._wrap(strategy)
        self.epochs.append(
            {
                "start": time.time(),
                "end": None,
                "batches": [],
                "rounds": [],
                "claims": [],
                "cpu_start": time.process_time(),
            }
        )

    def _wrap(self, strategy: Any) -> None:
        engine = strategy._engines["local"]  # the local-SGD engine's round end (private: this is a probe)
        end_round = engine._end_round

        def timed_end_round(done: bool) -> Any:
            enter, cpu = time.time(), time.process_time()
            outcome = end_round(done)
            self.epochs[-1]["rounds"].append([enter, time.time(), time.process_time() - cpu, done, outcome.samples])
            return outcome

        engine._end_round = timed_end_round
        sampler = strategy._run.ctx.claim_sampler if strategy._run is not None else None
        if sampler is not None:
            claim = sampler.claim

            def timed_claim(epoch: int, count: int) -> int:
                start = time.time()
                first = claim(epoch, count)
                self.epochs[-1]["claims"].append([start, time.time()])
                return first

            sampler.claim = timed_claim

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.epochs[-1]["batches"].append([time.time(), None])

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.epochs[-1]["batches"][-1][1] = time.time()

    def on_validation_batch_start(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        if self.epochs and self.epochs[-1]["end"] is None and trainer.state.fn == "fit":
            self.epochs[-1]["end"] = time.time()
            self.epochs[-1]["cpu_end"] = time.process_time()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        Path(f"{self.out}.rank{trainer.global_rank}.json").write_text(json.dumps(self.epochs))


def _overlap(start: float, end: float, intervals: list[list[float]]) -> float:
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in intervals)


def breakdown(ranks: list[list[dict[str, Any]]], skip_epochs: int = 1) -> dict[str, Any]:
    """Seconds per category per rank and summed over ranks, over the epochs after ``skip_epochs``: ``compute``
    (batches minus round ends), ``round_wait`` (before the last rank arrived), ``round_sync`` (after it), ``claims``,
    ``between_batches`` and ``epoch_edges`` (the span outside the rank's batches); and each rank's lateness.

    Example: two ranks, one epoch; rank 0 trains one batch, rank 1 two (claiming the second for 50 ms) and arrives
    at the round end 0.2 s after rank 0::

        >>> r0 = [{"start": 0.0, "end": 1.0, "batches": [[0.1, 0.9]], "rounds": [[0.5, 0.8, 0.0, True, 64]],
        ...        "claims": []}]
        >>> r1 = [{"start": 0.0, "end": 1.0, "batches": [[0.0, 0.4], [0.5, 0.8]],
        ...        "rounds": [[0.7, 0.8, 0.0, True, 64]], "claims": [[0.42, 0.47]]}]
        >>> b = breakdown([r0, r1], skip_epochs=0)
        >>> {k: round(v, 2) for k, v in b["total_s"].items()}  # adds up to 2 ranks x 1 s
        {'compute': 1.1, 'round_wait': 0.2, 'round_sync': 0.2, 'claims': 0.05, 'between_batches': 0.05, 'epoch_edges': 0.4}
        >>> round(b["span_s"], 2), b["round_ends"]
        (1.0, 1)
    """
    per_rank = [dict.fromkeys(CATEGORIES, 0.0) for _ in ranks]
    span = 0.0
    round_ends = 0
    cpu_in_rounds = [0.0 for _ in ranks]
    lateness: list[list[float]] = []
    for e in range(skip_epochs, min(len(r) for r in ranks)):
        epochs = [r[e] for r in ranks]
        first = min(ep["start"] for ep in epochs)
        last = max(ep["end"] for ep in epochs)
        span += last - first
        rounds = [ep["rounds"] for ep in epochs]
        count = min(len(r) for r in rounds)
        round_ends += count
        arrivals = [max(r[i][0] for r in rounds) for i in range(count)]
        lateness += [[r[i][0] - min(q[i][0] for q in rounds) for r in rounds] for i in range(count)]
        for k, ep in enumerate(epochs):
            cats = per_rank[k]
            own = rounds[k][:count]
            waits = [[enter, min(exit, arrival)] for (enter, exit, *_), arrival in zip(own, arrivals, strict=True)]
            syncs = [[max(enter, arrival), exit] for (enter, exit, *_), arrival in zip(own, arrivals, strict=True)]
            cpu_in_rounds[k] += sum(r[2] for r in own)
            in_round = [[enter, exit] for enter, exit, *_ in own]
            batches = ep["batches"]
            for start, end in batches:
                cats["compute"] += (end - start) - _overlap(start, end, in_round)
            cats["round_wait"] += sum(max(0.0, b - a) for a, b in waits)
            cats["round_sync"] += sum(max(0.0, b - a) for a, b in syncs)
            gaps = [[batches[i][1], batches[i + 1][0]] for i in range(len(batches) - 1)]
            claims = sum(_overlap(a, b, ep["claims"]) for a, b in gaps)
            cats["claims"] += claims
            cats["between_batches"] += sum(b - a for a, b in gaps) - claims
            cats["epoch_edges"] += (last - first) - (batches[-1][1] - batches[0][0])
    total = {c: sum(r[c] for r in per_rank) for c in CATEGORIES}
    return {
        "per_rank_s": per_rank,
        "total_s": total,
        "span_s": span,
        "round_ends": round_ends,
        "cpu_in_round_ends_s": cpu_in_rounds,
        "arrival_after_first_s": lateness,
    }


def collect(out: str, world_size: int) -> dict[str, Any]:
    """Read the ranks' records for ``out`` (and delete them); return :func:`breakdown` of them."""
    paths = [Path(f"{out}.rank{k}.json") for k in range(world_size)]
    ranks = [json.loads(p.read_text()) for p in paths]
    for p in paths:
        p.unlink()
    result = breakdown(ranks)
    result["claims_per_rank"] = [sum(len(ep["claims"]) for ep in r[1:]) for r in ranks]
    result["batches_per_rank"] = [sum(len(ep["batches"]) for ep in r[1:]) for r in ranks]
    return result


def format_breakdown(result: dict[str, Any], ranks: int) -> str:
    """One line: each category's share of the ranks' summed time (``ranks`` x the epochs' spans)."""
    whole = result["span_s"] * ranks
    parts = [f"{c} {result['total_s'][c] / whole:.0%}" for c in CATEGORIES]
    return ", ".join(parts) + f" ({result['round_ends']} round ends)"
