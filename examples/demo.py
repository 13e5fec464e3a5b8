"""The quick-start demo (``make demo``): heterogeneity-aware training on 2 CPU processes, before and after.

Rank 1 is made 4x slower with :class:`~lightning_hetero.SlowdownEmulator`. The demo trains the same model on the
same generated data twice, with plain DDP and with :class:`~lightning_hetero.HeteroBatchCallback`, then times a few
steps at each of several fixed splits (a sweep) to find the best split for this workload, and prints one table:
measured throughput, validation accuracy and split of each. It writes the numbers (``demo.json``), a plot of both
runs' throughput over time (``throughput.png``), a plot of each rank's batch size over time in both runs
(``batch_sizes.png``; both plots with matplotlib) and the training processes' full log (``train.log``) to ``--out``.
``scripts/draw_figures.py`` draws the same two plots for the docs from a committed ``demo.json``.

All training runs in one pair of processes (``python examples/demo.py --train``; Lightning's launcher starts rank 1
from the same command), so the runs share their conditions; the driver shows only the demo's own progress lines.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import statistics
import subprocess
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path

SLOW_FACTOR = 4.0
GLOBAL_BATCH = 1024
NUM_SAMPLES = 12 * GLOBAL_BATCH
EPOCHS = 3
# The fixed-split sweep: rank 1's batch at each point (rank 0 gets the rest), besides the equal and the learned split.
# Points are visited in turn, SWEEP_VISIT_STEPS steps per visit (the first SWEEP_SETTLE_STEPS not timed, while the
# slowdown emulator's estimate catches up), SWEEP_ROUNDS times, so that a change of machine load hits all alike.
SWEEP_SLOW_BATCHES = (384, 256, 128, 64)
SWEEP_VISIT_STEPS, SWEEP_SETTLE_STEPS, SWEEP_ROUNDS = 7, 3, 2
PROGRESS = "demo: "


# ---------------------------------------------------------------------------------------------- training processes


def train_all(out: Path) -> None:
    """Both runs and the sweep, in this process pair; rank 0 writes ``out/demo.json``."""
    # Lightning's banners and tips, and third-party deprecation warnings, say nothing about this demo.
    warnings.filterwarnings("ignore")
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import Callback

    for name in ("lightning.pytorch", "lightning.fabric", "lightning_utilities"):
        logging.getLogger(name).setLevel(logging.ERROR)

    from lightning_hetero import HeteroBatchCallback, SlowdownEmulator
    from lightning_hetero.synthetic import MLPClassifier, make_classification

    torch.set_num_threads(1)
    rank = int(os.environ.get("LOCAL_RANK", 0))

    def say(message: str) -> None:
        if rank == 0:
            print(PROGRESS + message, flush=True)

    class StepClock(Callback):
        """The wall-clock time at the end of every training step, with its epoch, and this rank's batch size at each
        step (rank 0's are reported; rank 1's batch is the global batch minus rank 0's)."""

        def __init__(self) -> None:
            self.steps: list[tuple[int, float]] = []
            self.batches: list[tuple[float, int]] = []

        def on_train_epoch_start(self, trainer, pl_module):
            self.steps.append((trainer.current_epoch, time.perf_counter()))  # the epoch's start counts as a step end

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            now = time.perf_counter()
            self.steps.append((trainer.current_epoch, now))
            self.batches.append((now, len(batch[0])))

    class Data(L.LightningDataModule):
        """Noisy Gaussian clusters: an MLP gets most of it right within a few epochs, and not all of it."""

        def __init__(self, batch_size: int, batch_sampler=None) -> None:
            super().__init__()
            features, labels = make_classification(NUM_SAMPLES * 5 // 4, 256, 10, seed=0, noise=9.0).tensors
            self.train_set = torch.utils.data.TensorDataset(features[:NUM_SAMPLES], labels[:NUM_SAMPLES])
            self.val_set = torch.utils.data.TensorDataset(features[NUM_SAMPLES:], labels[NUM_SAMPLES:])
            self.batch_size = batch_size
            self.batch_sampler = batch_sampler

        def train_dataloader(self):
            if self.batch_sampler is not None:
                return torch.utils.data.DataLoader(self.train_set, batch_sampler=self.batch_sampler)
            return torch.utils.data.DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

        def val_dataloader(self):
            return torch.utils.data.DataLoader(self.val_set, batch_size=1024)

    class SplitSchedule(torch.utils.data.Sampler):
        """Random batches of this rank's share of ``schedule[step]``: a fixed split per step, no controller."""

        def __init__(self, schedule: list[list[int]], rank: int, num_samples: int) -> None:
            self.sizes = [split[rank] for split in schedule]
            self.num_samples = num_samples
            self.seed = rank

        def __iter__(self):
            generator = torch.Generator().manual_seed(self.seed)
            for size in self.sizes:
                yield torch.randint(self.num_samples, (size,), generator=generator).tolist()

        def __len__(self) -> int:
            return len(self.sizes)

    def fit(callbacks: list[Callback], epochs: int, batch_sampler=None) -> tuple[L.Trainer, StepClock]:
        # quiet on every supported Lightning: seed_everything(verbose=False) is Lightning 2.4+
        logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)
        L.seed_everything(0)
        clock = StepClock()
        trainer = L.Trainer(
            accelerator="cpu",
            devices=2,
            strategy=L.pytorch.strategies.DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=120)),
            max_epochs=epochs,
            limit_val_batches=1.0 if batch_sampler is None else 0,
            num_sanity_val_steps=0,
            use_distributed_sampler=batch_sampler is None,
            callbacks=[SlowdownEmulator(factors={1: SLOW_FACTOR}), clock, *callbacks],
            logger=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            enable_progress_bar=False,
        )
        model = MLPClassifier(num_features=256, num_classes=10, hidden=2048, lr=0.05, momentum=0.9)
        trainer.fit(model, datamodule=Data(GLOBAL_BATCH // 2, batch_sampler))
        return trainer, clock

    results: dict = {"slow_factor": SLOW_FACTOR, "global_batch": GLOBAL_BATCH, "epochs": EPOCHS, "runs": {}}
    for method in ("ddp", "hetero"):
        say(f"training with {'plain DDP' if method == 'ddp' else 'HeteroBatchCallback'} ({EPOCHS} epochs) ...")
        hetero = HeteroBatchCallback(adjust_every_n_steps=4, verbose=False) if method == "hetero" else None
        trainer, clock = fit([hetero] if hetero else [], EPOCHS)
        results["runs"][method] = {
            "split": list(hetero.batch_sizes) if hetero else [GLOBAL_BATCH // 2] * 2,
            "val_acc": float(trainer.callback_metrics["val_acc"]),
            "steps": clock.steps,
            "rank0_batches": clock.batches,
        }

    learned = results["runs"]["hetero"]["split"][1]
    slow_batches = sorted({GLOBAL_BATCH // 2, learned, *SWEEP_SLOW_BATCHES}, reverse=True)
    say(f"timing {len(slow_batches)} fixed splits, {SWEEP_ROUNDS} rounds of {SWEEP_VISIT_STEPS} steps each ...")
    splits = [[GLOBAL_BATCH - slow, slow] for slow in slow_batches]
    schedule = [split for _ in range(SWEEP_ROUNDS) for split in splits for _ in range(SWEEP_VISIT_STEPS)]
    _, clock = fit([], 1, batch_sampler=SplitSchedule(schedule, rank, NUM_SAMPLES))
    results["sweep"] = {"schedule": schedule, "steps": clock.steps}
    if rank == 0:
        (out / "demo.json").write_text(json.dumps(results))
    torch.distributed.destroy_process_group()


# ---------------------------------------------------------------------------------------------- driver


def throughput(steps: list[list[float]], skip_steps: dict[int, int]) -> float:
    """Samples per second at the median step time of the timed steps: each epoch's after ``skip_steps[epoch]``.

    The median, because on a shared machine a few steps take many times longer than the rest.

    >>> throughput([[0, 0.0], [0, 1.0], [0, 1.5], [0, 2.0], [1, 5.0], [1, 5.5], [1, 9.5]], {0: 1, 1: 0})
    2048.0
    """
    intervals = []
    for epoch, skip in skip_steps.items():
        times = [t for e, t in steps if e == epoch][skip:]
        intervals += [after - before for before, after in itertools.pairwise(times)]
    return GLOBAL_BATCH / statistics.median(intervals)


def main_run_throughput(run: dict) -> float:
    """A run's throughput over every epoch after the first (which pays for start-up and finding the split)."""
    return throughput(run["steps"], {epoch: 0 for epoch in range(1, EPOCHS)})


def sweep_throughputs(sweep: dict) -> dict[tuple[int, ...], float]:
    """Samples per second at each split of the sweep, from the median time of its timed steps in every round."""
    intervals: dict[tuple[int, ...], list[float]] = {}
    times = [t for _, t in sweep["steps"]]  # times[0] is the epoch's start, times[i + 1] the end of step i
    for step, split in enumerate(sweep["schedule"]):
        if step % SWEEP_VISIT_STEPS >= SWEEP_SETTLE_STEPS:
            intervals.setdefault(tuple(split), []).append(times[step + 1] - times[step])
    return {split: GLOBAL_BATCH / statistics.median(values) for split, values in intervals.items()}


def report(results: dict) -> list[str]:
    ddp, hetero = results["runs"]["ddp"], results["runs"]["hetero"]
    run_rates = {"ddp": main_run_throughput(ddp), "hetero": main_run_throughput(hetero)}
    sweep = sweep_throughputs(results["sweep"])
    best_split = max(sweep, key=sweep.get)
    best = sweep[best_split]
    rows = [
        ("plain DDP", f"{run_rates['ddp']:.0f}", f"{ddp['val_acc']:.3f}", tuple(ddp["split"])),
        ("HeteroBatchCallback", f"{run_rates['hetero']:.0f}", f"{hetero['val_acc']:.3f}", tuple(hetero["split"])),
        ("best fixed split (sweep)", "-", "-", best_split),
    ]
    lines = [
        f"{'':<25}{'training run':^20}  {'fixed-split sweep':^20}".rstrip(),
        f"{'':<25}{'samples/s':>11}{'val acc':>9}  {'samples/s':>11}{'of best':>9}   batch per rank",
    ]
    for name, rate, acc, split in rows:
        lines.append(f"{name:<25}{rate:>11}{acc:>9}  {sweep[split]:>11.0f}{sweep[split] / best:>9.0%}   {list(split)}")
    points = ", ".join(f"{split[1]}: {rate:.0f}" for split, rate in sorted(sweep.items()))
    lines += [
        "",
        f"HeteroBatchCallback trained {run_rates['hetero'] / run_rates['ddp']:.2f}x as fast as plain DDP "
        f"(same global batch {GLOBAL_BATCH}; rank 1 {results['slow_factor']:g}x slower).",
        f"Training run: global batch / median step time over epochs 2-{EPOCHS}. Sweep: the same model and data at",
        f"fixed splits, visited in turn ({SWEEP_ROUNDS} rounds), median step time; rank 1's batch -> samples/s:",
        f"  {points}",
    ]
    return lines


def plot(results: dict, path: Path) -> str:
    """Both runs' throughput against training time; returns a line saying what was written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"{path.name} not written: matplotlib is not installed (pip install matplotlib)"
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for method, label in (("ddp", "plain DDP"), ("hetero", "HeteroBatchCallback")):
        steps = results["runs"][method]["steps"]
        start = steps[0][1]
        xs, ys = [], []
        for (epoch, before), (next_epoch, after) in itertools.pairwise(steps):
            if epoch == next_epoch:
                xs.append(after - start)
                ys.append(GLOBAL_BATCH / (after - before))
        ax.plot(xs, ys, ".-", label=label, markersize=3, linewidth=1)
    best = max(sweep_throughputs(results["sweep"]).values())
    ax.axhline(best, color="grey", linestyle="--", linewidth=1, label="best fixed split (sweep)")
    ax.set_xlabel("seconds since the start of training (gaps: validation)")
    ax.set_ylabel("samples/s per step")
    ax.set_title(f"rank 1 emulated {results['slow_factor']:g}x slower, 2 CPU processes")
    ax.set_ylim(bottom=0)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"plot of both runs' throughput over time: {path}"


def plot_batch_sizes(results: dict, path: Path) -> str:
    """Each rank's batch size at every step of both runs, against training time; returns a line saying what was
    written. Runs without recorded batch sizes (a ``demo.json`` from before they were recorded) are left out."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"{path.name} not written: matplotlib is not installed (pip install matplotlib)"
    global_batch = results.get("global_batch", GLOBAL_BATCH)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for method, label, style in (("ddp", "plain DDP", ":"), ("hetero", "HeteroBatchCallback", "-")):
        batches = results["runs"][method].get("rank0_batches", [])
        if not batches:
            continue
        start = results["runs"][method]["steps"][0][1]
        xs = [t - start for t, _ in batches]
        ax.step(xs, [b for _, b in batches], style, where="post", color="C0", label=f"rank 0 (fast), {label}")
        ax.step(
            xs,
            [global_batch - b for _, b in batches],
            style,
            where="post",
            color="C1",
            label=f"rank 1 ({results['slow_factor']:g}x slower), {label}",
        )
    ax.set_xlabel("seconds since the start of each run's training")
    ax.set_ylabel("samples per step")
    ax.set_title(f"each rank's share of the global batch of {global_batch}")
    ax.set_ylim(bottom=0, top=global_batch)
    ax.legend(loc="center right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"plot of each rank's batch size over time: {path}"


def drive(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    print(f"lightning-hetero demo: 2 CPU processes, rank 1 emulated {SLOW_FACTOR:g}x slower", flush=True)
    start = time.monotonic()
    env = {key: value for key, value in os.environ.items() if key != "MASTER_PORT"}
    env["PYTHONUNBUFFERED"] = "1"
    log_path = out / "train.log"
    with (
        log_path.open("w") as log,
        subprocess.Popen(
            [sys.executable, __file__, "--train", "--out", str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        ) as proc,
    ):
        for line in proc.stdout:
            log.write(line)
            if line.startswith(PROGRESS):
                print(f"  [{time.monotonic() - start:3.0f} s] {line[len(PROGRESS) :].rstrip()}", flush=True)
    if proc.returncode != 0:
        print(f"training failed (exit {proc.returncode}); the end of {log_path}:", file=sys.stderr)
        print("".join(log_path.read_text().splitlines(keepends=True)[-40:]), file=sys.stderr)
        return 1
    results = json.loads((out / "demo.json").read_text())
    print()
    print("\n".join(report(results)))
    print()
    print(plot(results, out / "throughput.png"))
    print(plot_batch_sizes(results, out / "batch_sizes.png"))
    print(f"numbers: {out / 'demo.json'}; full training log: {log_path}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("demo_output"), help="folder for the results (demo_output)")
    parser.add_argument("--train", action="store_true", help="run the training processes (used by the driver)")
    args = parser.parse_args()
    if args.train:
        train_all(args.out)
        return 0
    return drive(args.out)


if __name__ == "__main__":
    sys.exit(main())
