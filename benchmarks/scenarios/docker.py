"""Real CPU limits: plain DDP and HeteroBatch BSP in 2 worker containers under quotas (needs Docker; not in CI).

``docker_worker.py``'s CIFAR ResNet-20 at HL2 and HL4 (``LEVELS``) against the sum of each quota's standalone
throughput; ``--sweep``: also fixed splits, ``--paired N`` the controller against the best one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.harness.launch import RESULTS, ROOT
from benchmarks.harness.record import write_json
from benchmarks.harness.stats import proportional_splits, rotating_order
from lightning_hetero.allocation import apportion
from lightning_hetero.emulation.config import load_config
from lightning_hetero.emulation.docker_backend import DockerBackend
from lightning_hetero.emulation.plan import ContainerUpdate
from lightning_hetero.emulation.runner import run_static

WORKER = ROOT / "benchmarks" / "docker_worker.py"
METHODS = ("ddp", "hetero")
METHOD_NAMES = {"ddp": "plain DDP", "hetero": "HeteroBatch", "static": "static"}
#: docker_worker.py's data per training and standalone run, and its batch per rank
TRAIN_ARGS = ["--samples", "2048", "--batch-size", "64", "--val-samples", "256"]
STANDALONE_ARGS = ["--samples", "1024", "--batch-size", "64", "--val-samples", "256"]
BATCH_PER_RANK = 64
SWEEP_GAMMAS = (0.75, 1.0, 1.5, 3.0)
IMAGE = "lightning-hetero-worker:latest"
#: CPU quotas per container, fastest first: OmniLearn's max/min ratio with the fastest at 1 CPU
LEVELS = {2: {"HL1": [1.0, 1.0], "HL2": [1.0, 0.5], "HL4": [1.0, 0.25]}}
WORKERS = 2

#: why ``--grid`` does not apply
NO_GRID = "not here: its conditions are real Docker quotas on a host with Docker; the quota grid runs in the controller scenario"


def timed_throughput(reports: list[dict[str, Any]], warmup: int = 1) -> dict[str, Any]:
    """Samples per second over the epochs after ``warmup``, and each timed epoch's own throughput."""
    epochs = sorted({e["epoch"] for r in reports for e in r["epochs"]} - set(range(warmup)))
    per_epoch, total_s, total_samples = [], 0.0, 0
    for epoch in epochs:
        windows = [e for r in reports for e in r["epochs"] if e["epoch"] == epoch]
        seconds = max(e["end"] for e in windows) - min(e["start"] for e in windows)
        samples = sum(e["samples"] for e in windows)
        per_epoch.append(samples / seconds)
        total_s, total_samples = total_s + seconds, total_samples + samples
    return {"throughput": total_samples / total_s, "per_epoch": per_epoch, "train_s": total_s, "epochs": epochs}


def pinned_cpusets(workers: int, host_cpus: int) -> list[str]:
    """With ``--pin``: each container's own core, the host's cores taken in turn (2 containers on 2 cores: one core
    each, as on separate machines; 4 containers: two a core).

    Example::

        >>> pinned_cpusets(2, 2), pinned_cpusets(4, 2)
        (['0', '1'], ['0', '1', '0', '1'])
    """
    return [str(k % host_cpus) for k in range(workers)]


def level_overrides(levels: dict[str, list[float]], cpusets: list[str] | None) -> list[str]:
    """The emulator's user levels for ``levels`` (user levels may not reuse the presets' names: ``q<name>`` holds the
    quotas of ``<name>``), each container with its quota and, given ``cpusets``, its own core.

    Example::

        >>> level_overrides({"HL4": [1.0, 0.25]}, None)
        ['levels.qHL4=[1.0,0.25]']
        >>> level_overrides({"HL4": [1.0, 0.25]}, ["0", "1"])
        ["levels.qHL4=[{cpuset: '0', cpus: 1.0},{cpuset: '1', cpus: 0.25}]"]
    """

    def allocation(container: int, quota: float) -> str:
        return str(quota) if cpusets is None else f"{{cpuset: '{cpusets[container]}', cpus: {quota}}}"

    return [
        f"levels.q{name}=[{','.join(allocation(k, quota) for k, quota in enumerate(quotas))}]"
        for name, quotas in levels.items()
    ]


def standalone_cpuset(levels: dict[str, list[float]], cpusets: list[str] | None, quota: float, host_cpus: int) -> str:
    """Where a standalone run at ``quota`` computes: given ``cpusets``, the core of the first container that runs at
    that quota in a level; else all of the host's cores.

    Example::

        >>> levels = {"HL2": [1.0, 0.5], "HL4": [1.0, 0.25]}
        >>> standalone_cpuset(levels, ["0", "1"], 0.25, 2), standalone_cpuset(levels, None, 0.25, 2)
        ('1', '0-1')
    """
    if cpusets is None:
        return f"0-{host_cpus - 1}"
    return next(
        cpusets[k] for quotas in levels.values() for k, level_quota in enumerate(quotas) if level_quota == quota
    )


def static_splits(standalone: list[float], global_batch: int) -> list[list[int]]:
    """Candidate fixed splits: proportional to ``standalone**gamma`` for each of ``SWEEP_GAMMAS``, then the slowest
    container at one sample (where a slow container's fixed cost per step outweighs its samples).

    Example::

        >>> static_splits([100.0, 25.0], 128)
        [[95, 33], [103, 25], [114, 14], [127, 1]]
    """
    n = len(standalone)
    candidates = proportional_splits(standalone, global_batch, SWEEP_GAMMAS)
    slowest = min(range(n), key=lambda k: standalone[k])
    floor = apportion(
        [0.0 if k == slowest else x for k, x in enumerate(standalone)], global_batch, [1] * n, [global_batch] * n
    )
    return candidates + ([floor] if floor not in candidates else [])


class Cluster:
    """Worker containers with unique names on their own network, a shared run directory, and the emulator."""

    def __init__(self, workers: int, run_dir: Path, image: str = IMAGE, pin: bool = False) -> None:
        tag = uuid.uuid4().hex[:6]
        self.names = [f"lh-bench-{tag}-w{i}" for i in range(workers)]
        self.run_dir = run_dir
        self.base = [
            f"containers=[{','.join(self.names)}]",
            f"cluster.image={image}",
            f"cluster.network=lh-bench-{tag}",
            f"progress_dir={run_dir}",
            "allocation=quota",
        ]
        self.levels = LEVELS[workers]
        self.backend = DockerBackend.connect()
        #: each container's cpuset with ``--pin`` (``None``: every container floats over all of the host's cores)
        self.cpusets = pinned_cpusets(workers, self.backend.host_cpus()) if pin else None
        self.backend.create_cluster(load_config(overrides=self.base))
        shutil.copy(WORKER, run_dir / "docker_worker.py")

    def overrides(self, extra: list[str]) -> list[str]:
        return [*self.base, *level_overrides(self.levels, self.cpusets), *extra]

    def apply(self, level: str) -> None:
        run_static(load_config(overrides=self.overrides([f"level=q{level}"])), self.backend)

    def cgroups(self) -> list[dict[str, Any]]:
        return [vars(self.backend.cpu_cgroup(name)) for name in self.names]

    def train(self, run: str, method: str, epochs: int, split: list[int] | None = None) -> dict[str, Any]:
        out = f"/progress/{run}"
        (self.run_dir / run / "progress").mkdir(parents=True)
        before = self.cgroups()
        command = ["timeout", "1200", "python", "/progress/docker_worker.py", out, "--method", method]
        command += ["--epochs", str(epochs), *TRAIN_ARGS]
        if split is not None:
            command += ["--split", ",".join(map(str, split))]
        containers = [self.backend.client.containers.get(name) for name in self.names]
        started = time.time()
        with ThreadPoolExecutor(len(containers)) as pool:
            runs = list(pool.map(lambda c: c.exec_run(command, environment={"GLOO_SOCKET_IFNAME": "eth0"}), containers))
        wall_s = time.time() - started
        after = self.cgroups()
        for name, result in zip(self.names, runs, strict=True):
            if result.exit_code != 0:
                raise RuntimeError(f"{name}: {method} exited {result.exit_code}:\n{result.output.decode()[-3000:]}")
        reports = [json.loads((self.run_dir / run / f"report-rank{k}.json").read_text()) for k in range(len(runs))]
        throttling = [
            {"nr_throttled": a["nr_throttled"] - b["nr_throttled"], "throttled_s": a["throttled_s"] - b["throttled_s"]}
            for a, b in zip(after, before, strict=True)
        ]
        quotas = [c["quota_us"] for c in after]
        return {
            "reports": reports,
            "wall_s": wall_s,
            "throttling": throttling,
            "quotas": quotas,
            "cpusets": self.cpusets_held(),
        }

    def cpusets_held(self) -> list[str]:
        """Each container's cpuset as Docker holds it now (a floating level sets all of the host's cores, ``0-1`` on 2)."""
        return [self.backend.client.containers.get(name).attrs["HostConfig"]["CpusetCpus"] for name in self.names]

    def standalone(self, quota_cpus: float, epochs: int) -> float:
        """One process alone in the first container at ``quota_cpus`` (with ``--pin`` on that quota's core): the ideal
        samples/s at that quota."""
        name = self.names[0]
        cpuset = standalone_cpuset(self.levels, self.cpusets, quota_cpus, self.backend.host_cpus())
        update = ContainerUpdate(name, cpuset, int(quota_cpus * 100_000), 100_000)
        self.backend.apply([update], reason=f"standalone at {quota_cpus:g} CPU")
        return self._standalone_run(name, f"standalone-{quota_cpus:g}", epochs)

    def concurrent_standalone(self, level: str, epochs: int, tag: str) -> list[float]:
        """Every container trains alone at once under ``level``'s quotas (no communication): each one's samples/s
        while the others compute too, as the host delivers it during a distributed run."""
        self.apply(level)
        runs = [f"concurrent-{level}-{tag}-w{k}" for k in range(len(self.names))]
        with ThreadPoolExecutor(len(self.names)) as pool:
            return list(pool.map(lambda pair: self._standalone_run(*pair, epochs), zip(self.names, runs, strict=True)))

    def _standalone_run(self, name: str, run: str, epochs: int) -> float:
        (self.run_dir / run).mkdir()
        command = ["timeout", "1200", "python", "/progress/docker_worker.py", f"/progress/{run}", "--standalone"]
        command += ["--epochs", str(epochs), *STANDALONE_ARGS]
        result = self.backend.client.containers.get(name).exec_run(command)
        if result.exit_code != 0:
            raise RuntimeError(f"{run}: {result.output.decode()[-3000:]}")
        report = json.loads((self.run_dir / run / "report-rank0.json").read_text())
        return timed_throughput([report])["throughput"]

    def remove(self) -> None:
        self.backend.remove_cluster(load_config(overrides=self.base))


def run_workers(workers: int, args: argparse.Namespace, run_dir: Path) -> tuple[list[dict[str, Any]], dict]:
    cluster = Cluster(workers, run_dir, args.image, pin=args.pin)
    rows = []
    try:
        quotas = sorted({q for name in args.levels for q in cluster.levels[name]}, reverse=True)
        ideal_at = {}
        for quota in quotas:
            ideal_at[quota] = cluster.standalone(quota, args.epochs)
            load = os.getloadavg()[0]
            print(f"standalone at {quota:g} CPU: {ideal_at[quota]:.0f} samples/s (load {load:.1f})", flush=True)
        global_batch = workers * BATCH_PER_RANK
        for repeat in range(args.repeats):
            for level in args.levels:
                concurrent = None
                if args.concurrent_ideal:
                    concurrent = cluster.concurrent_standalone(level, args.epochs, str(repeat))
                    print(f"{level} concurrent standalone: {' + '.join(f'{x:.0f}' for x in concurrent)} samples/s")
                runs: list[tuple[str, list[int] | None, int | None]] = [(m, None, None) for m in args.methods]
                if args.sweep:
                    speeds = [ideal_at[q] for q in cluster.levels[level]]
                    runs += [("static", split, None) for split in static_splits(speeds, global_batch)]
                paired = not (args.sweep and args.paired)  # True once the pairs are queued
                while runs:
                    method, split, pair = runs.pop(0)
                    cluster.apply(level)
                    label = method if split is None else f"static-{'-'.join(map(str, split))}"
                    run = f"{workers}w-{level}-{label}-{repeat}-{len(rows)}"
                    result = cluster.train(run, "hetero" if split else method, args.epochs, split)
                    measured = timed_throughput(result["reports"])
                    ideal = sum(ideal_at[q] for q in cluster.levels[level])
                    report = result["reports"][0]
                    hetero = report.get("hetero")
                    row = {
                        "workers": workers,
                        "model": "resnet20",
                        "level": level,
                        "method": method,
                        "split": split,
                        "repeat": repeat,
                        "pair": pair,
                        "throughput": measured["throughput"],
                        "per_epoch": measured["per_epoch"],
                        "ideal": ideal,
                        "of_ideal": measured["throughput"] / ideal,
                        "concurrent_ideal": None if concurrent is None else sum(concurrent),
                        "of_concurrent_ideal": None if concurrent is None else measured["throughput"] / sum(concurrent),
                        "hetero": hetero,
                        "changes_after_warmup": changes_after_warmup(hetero),
                        "final_split": report["final_split"],
                        "val_acc": report["epochs"][-1].get("val_acc"),
                        "throttling": result["throttling"],
                        "cpusets": result["cpusets"],
                        "wall_s": result["wall_s"],
                        "load_average_1min": os.getloadavg()[0],
                    }
                    rows.append(row)
                    print(format_row(row), flush=True)
                    if args.sweep and method == "hetero" and split is None and pair is None:
                        runs.insert(0, ("static", list(row["final_split"]), None))  # its split, right after
                    if not runs and not paired:
                        paired, best = True, best_static_split(rows, workers, level, repeat)
                        runs += paired_runs(best, args.paired)
    finally:
        cluster.remove()
    return rows, {f"{quota:g}": throughput for quota, throughput in ideal_at.items()}


def changes_after_warmup(hetero: dict[str, Any] | None, warmup_epochs: int = 1) -> int | None:
    """How many split changes HeteroBatch made after the untimed warm-up epoch(s) (``None`` without HeteroBatch).

    Example::

        >>> changes_after_warmup({"history": [{"epoch": 0}, {"epoch": 0}, {"epoch": 2}]})
        1
    """
    if hetero is None:
        return None
    return sum(1 for change in hetero["history"] if change["epoch"] >= warmup_epochs)


def best_static_split(rows: list[dict[str, Any]], workers: int, level: str, repeat: int) -> list[int]:
    """The fixed split with the highest throughput among one repeat's static runs of a level (the sweep's best)."""
    statics = [
        r for r in rows if (r["workers"], r["level"], r["repeat"], r["method"]) == (workers, level, repeat, "static")
    ]
    return list(max(statics, key=lambda r: r["throughput"])["split"])


def paired_runs(best: list[int], pairs: int) -> list[tuple[str, list[int] | None, int]]:
    """The controller and the best static split, alternating ``pairs`` times; the order flips each pair so that a
    load drifting during the pairs does not favour one arm.

    Example::

        >>> paired_runs([105, 23], 2)
        [('hetero', None, 0), ('static', [105, 23], 0), ('static', [105, 23], 1), ('hetero', None, 1)]
    """
    arms: list[tuple[str, list[int] | None]] = [("hetero", None), ("static", list(best))]
    return [(method, split, i // 2) for i, (method, split) in enumerate(rotating_order(arms, pairs))]


def paired_ratios(rows: list[dict[str, Any]]) -> dict[tuple[int, str], list[float]]:
    """Per (workers, level): the controller's throughput over the static split's, one ratio per pair and repeat.

    Example::

        >>> rows = [{"workers": 2, "level": "HL4", "repeat": 0, "pair": 0, "method": m, "throughput": t}
        ...         for m, t in (("hetero", 90.0), ("static", 100.0))]
        >>> paired_ratios(rows)
        {(2, 'HL4'): [0.9]}
    """
    arms: dict[tuple, dict[str, float]] = {}
    for row in rows:
        if row.get("pair") is not None:
            key = (row["workers"], row["level"], row["repeat"], row["pair"])
            arms.setdefault(key, {})[row["method"]] = row["throughput"]
    ratios: dict[tuple[int, str], list[float]] = {}
    for (workers, level, _, _), pair in arms.items():
        if {"hetero", "static"} <= pair.keys():
            ratios.setdefault((workers, level), []).append(pair["hetero"] / pair["static"])
    return ratios


def format_row(row: dict[str, Any]) -> str:
    throttled = " ".join(f"{t['nr_throttled']}/{t['throttled_s']:.1f}s" for t in row["throttling"])
    split = "" if row["final_split"] is None else "/".join(map(str, row["final_split"]))
    acc = "" if row["val_acc"] is None else f"{row['val_acc']:.3f}"
    return (
        f"{row['workers']:>2} {row['level']:<9} {METHOD_NAMES[row['method']]:<12} {row['throughput']:>8.0f} "
        f"{row['ideal']:>7.0f} {row['of_ideal']:>6.2f} {split:>9} {acc:>6}  {throttled}"
    )


def summarise(rows: list[dict[str, Any]]) -> list[str]:
    lines = [" n level     method          samples/s   ideal  of_id  split(0/1)  acc  throttled periods/time"]
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        split = row.get("split")
        key = (row["workers"], row["level"], row["method"], None if split is None else tuple(split))
        groups.setdefault(key, []).append(row)
    medians = {key: statistics.median(r["throughput"] for r in group) for key, group in groups.items()}
    for (workers, level, method, split), group in groups.items():
        median = medians[(workers, level, method, split)]
        ddp = medians.get((workers, level, "ddp", None))
        vs_ddp = median / ddp if ddp else float("nan")
        ideal = statistics.median(r["ideal"] for r in group)
        extra = ""
        concurrent = [r["concurrent_ideal"] for r in group if r.get("concurrent_ideal")]
        if concurrent:
            extra += f", {median / statistics.median(concurrent):.2f} of the concurrent ideal"
        statics = [m for (w, lv, me, _), m in medians.items() if (w, lv, me) == (workers, level, "static")]
        if method == "hetero" and statics:
            extra += f", {median / max(statics):.2f} of the best static split"
        name = METHOD_NAMES[method] + ("" if split is None else " " + "/".join(map(str, split)))
        lines.append(
            f"{workers:>2} {level:<9} {name:<18} median {median:>6.0f} samples/s "
            f"({median / ideal:.2f} of ideal, {vs_ddp:.2f}x DDP{extra}, {len(group)} run(s))"
        )
    for (workers, level), ratios in paired_ratios(rows).items():
        listed = ", ".join(f"{r:.3f}" for r in ratios)
        lines.append(
            f"{workers:>2} {level:<9} paired HeteroBatch / best static split: median "
            f"{statistics.median(ratios):.3f} ({listed})"
        )
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--levels", nargs="+", default=["HL2", "HL4"], choices=["HL2", "HL4"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--epochs", type=int, default=4, help="epochs per run; the first is an untimed warm-up")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--sweep", action="store_true", help="also run fixed splits (static levels only)")
    parser.add_argument("--paired", type=int, default=0, help="with --sweep: N controller / best split pairs")
    parser.add_argument("--concurrent-ideal", action="store_true", help="also the standalone runs all at once")
    parser.add_argument("--pin", action="store_true", help="each container on its own core beside its quota")
    parser.add_argument("--quick", action="store_true", help="HL4, DDP and HeteroBatch, 3 epochs")
    parser.add_argument("--out", type=Path, default=RESULTS / "docker.json")
    parser.add_argument("--image", default=IMAGE, help="the worker image to build from this checkout and run")


def main(args: argparse.Namespace) -> None:
    if args.quick:
        args.levels, args.methods, args.epochs = ["HL4"], ["ddp", "hetero"], 3
    build = subprocess.run([str(ROOT / "docker" / "build-image.sh"), "--tag", args.image])
    if build.returncode != 0:
        sys.exit("bench_docker: the worker image could not be built (above)")
    with tempfile.TemporaryDirectory(prefix="lh-bench-docker-") as tmp:
        rows, standalone = run_workers(WORKERS, args, Path(tmp) / f"{WORKERS}w")
    lines = summarise(rows)
    print("\n".join(lines))
    host_cpus = DockerBackend.connect().host_cpus()
    cpusets = pinned_cpusets(WORKERS, host_cpus) if args.pin else None
    conditions = {"docker_cpus": host_cpus, "levels": {"2": LEVELS[WORKERS]}, "cpusets": {"2": cpusets}}
    result = {"conditions": conditions, "standalone_samples_per_s": {2: standalone}, "rows": rows, "summary": lines}
    write_json(args.out, result)
