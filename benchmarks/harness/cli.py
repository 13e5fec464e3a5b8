"""``python -m benchmarks list`` and ``python -m benchmarks run SCENARIO [flags]``.

Besides its own flags, every scenario takes ``--grid [--grid-axes ...]`` (:mod:`.grid`), ``--check`` (parse the
flags and exit) and, where it has none, ``--repeats N``. Unknown flags are errors.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import NoReturn

from benchmarks import scenarios
from benchmarks.harness.grid import AXES, run_grid
from benchmarks.harness.record import begin


class ScenarioParser(argparse.ArgumentParser):
    """An argument parser whose errors name the scenario and where its flags are listed."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (its flags: {self.prog} --help)\n")


def scenario_parser(name: str) -> tuple[argparse.ArgumentParser, bool]:
    """The parser of scenario ``name``'s flags plus the harness's; whether the harness adds ``--repeats``."""
    module = scenarios.load(name)
    parser = ScenarioParser(
        prog=f"python -m benchmarks run {name}",
        description=module.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    module.add_arguments(parser)
    harness = parser.add_argument_group("harness")
    harness.add_argument("--grid", action="store_true", help="run the study over the grid of conditions")
    harness.add_argument(
        "--grid-axes",
        default="",
        help=f"comma-separated axes of the grid (default: base,{','.join(AXES)}; the base cell only if named)",
    )
    harness.add_argument("--check", action="store_true", help="parse the flags and exit")
    own_repeats = any("--repeats" in action.option_strings for action in parser._actions)
    if not own_repeats:
        harness.add_argument("--repeats", type=int, default=1, help="run the whole study this many times")
    return parser, not own_repeats


def run(name: str, argv: list[str]) -> None:
    parser, harness_repeats = scenario_parser(name)
    args = parser.parse_args(argv)
    module = scenarios.load(name)
    if args.check:
        print(f"{name}: flags parse")
        return
    out_dest = getattr(module, "OUT_DEST", "out")
    if args.grid:
        if not hasattr(module, "grid_axes"):
            print(f"{name}: no grid: {getattr(module, 'NO_GRID', 'the study reports no throughput figure')}")
            return
        if getattr(args, out_dest, None) is None:
            setattr(args, out_dest, module.default_out(args))
        axes = [a for a in args.grid_axes.split(",") if a]
        run_grid(name, args, out_dest, module.grid_axes(args), module.main, module.figures, axes)
        return
    repeats = args.repeats if harness_repeats else 1
    for k in range(repeats):  # the harness's repeats: each writes its own JSON, ``<out>_r<k>``
        each, out = copy.copy(args), getattr(args, out_dest, None)
        if repeats > 1 and out is not None:
            setattr(each, out_dest, Path(out).with_name(f"{Path(out).stem}_r{k + 1}{Path(out).suffix}"))
        begin(each)
        module.main(each)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m benchmarks list | run SCENARIO [flags] [--grid] [--check] | run SCENARIO --help"
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__ + "\n" + usage)
        return
    if argv[0] == "list":
        for name in scenarios.names():
            doc = (scenarios.load(name).__doc__ or "").strip().splitlines()
            print(f"{name:<24} {doc[0] if doc else ''}")
        return
    if argv[0] == "run" and len(argv) > 1:
        try:
            scenarios.load(argv[1])
        except KeyError as error:
            sys.exit(f"python -m benchmarks run: {error.args[0]}")
        run(argv[1], argv[2:])
        return
    sys.exit(usage)
