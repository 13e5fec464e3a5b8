"""The simulated grid of issue 46: every cell's second-half step against the best fixed split, per seed.

``python -m tests.hetero_batch.simulated_grid [--seeds 1 2 3] [--cells 4]`` prints one line per cell and cadence:
the fraction of the best fixed split reached per seed (median, worst), the changes of split in the second half,
inversions (the throttled rank given more than another) and the final splits. Simulated ranks, not product figures.
"""

from __future__ import annotations

import argparse
import logging
import statistics

from tests.hetero_batch.simulated_ranks import best_fixed, changes, run_tuner
from tests.hetero_batch.test_outcome_policy import quota_ranks, second_half

#: (ranks, quota of the last rank, global batch, steps in an epoch, CPU seconds per sample)
CELLS = [
    (2, 0.25, 64, 32, 0.001),
    (2, 0.5, 64, 32, 0.001),
    (2, 0.125, 64, 32, 0.001),
    (2, 0.25, 128, 32, 0.0005),
    (2, 0.25, 64, 32, 0.002),
    (2, 0.25, 64, 256, 0.001),
    (2, 0.5, 128, 256, 0.002),
    (2, 0.125, 128, 256, 0.002),
    (4, 0.25, 64, 32, 0.001),
    (4, 0.125, 128, 32, 0.001),
    (4, 0.5, 64, 32, 0.001),
    (4, 0.25, 128, 256, 0.0005),
]


def cell(world, quota, batch, steps, per_sample_s, every, seeds):
    factory = quota_ranks(world, quota, per_sample_s=per_sample_s)
    best, best_s = best_fixed(factory, batch)
    reached, moves, inversions, finals = [], [], 0, []
    for seed in seeds:
        run = run_tuner(factory(seed), batch, epochs=3, steps_in_epoch=steps, adjust_every_n_steps=every)
        splits, walls = second_half(run)
        reached.append(best_s / (sum(walls) / len(walls)))
        moves.append(changes(splits))
        inversions += sum(1 for split in run["splits"] if split[-1] > min(split[:-1]))
        finals.append(run["splits"][-1])
    return best, reached, moves, inversions, finals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--cells", type=int, nargs="*", help="only cells with this many ranks")
    args = parser.parse_args()
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    for world, quota, batch, steps, per_sample_s in CELLS:
        if args.cells and world not in args.cells:
            continue
        for every in (None, 8):
            best, reached, moves, inversions, finals = cell(world, quota, batch, steps, per_sample_s, every, args.seeds)
            figures = " ".join(f"{r:.2f}" for r in reached)
            print(
                f"{world} ranks q{quota} b{batch} {steps} steps {per_sample_s * 1e3:g} ms every={every}: "
                f"median {statistics.median(reached):.2f} worst {min(reached):.2f} ({figures}); "
                f"changes {moves}; inversions {inversions}; best {list(best)}; final {[list(f) for f in finals]}",
                flush=True,
            )


if __name__ == "__main__":
    main()
