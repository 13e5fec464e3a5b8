"""Every ``python -m benchmarks run ...`` command on the results page names a scenario that exists, and its flags
parse (what ``--check`` does), whatever the page's rows are."""

from __future__ import annotations

import re
import shlex

import pytest
from benchmarks.harness.cli import scenario_parser
from benchmarks.harness.launch import ROOT

PAGES = [ROOT / "docs" / "results.md", ROOT / "docs" / "lab" / "grid_figures.md"]
COMMAND = re.compile(r"`[^`]*?(python -m benchmarks run [^`]+)`")


def commands(text: str) -> list[list[str]]:
    """The argument lists after ``python -m benchmarks run`` in ``text``'s code spans: a span's command ends at
    ``&&``; ``[optional]`` flags are taken as given; a placeholder scenario (``<scenario>``) is not a command.

    Example::

        >>> commands("`python -m benchmarks run ps_scale --configs 2x0.25Mx3 [--epoch-s 2.0] && ls`")
        [['ps_scale', '--configs', '2x0.25Mx3', '--epoch-s', '2.0']]
        >>> commands("`python -m benchmarks run <scenario> [flags]`")
        []
    """
    found = []
    for span in COMMAND.findall(text):
        tokens = shlex.split(span)[4:]
        if "&&" in tokens:
            tokens = tokens[: tokens.index("&&")]
        tokens = [token.removeprefix("[").removesuffix("]") for token in tokens]
        if tokens and re.fullmatch(r"\w+", tokens[0]):
            found.append(tokens)
    return found


CASES = [argv for page in PAGES if page.exists() for argv in commands(page.read_text())]


def test_the_results_page_has_commands():
    assert CASES


@pytest.mark.parametrize("argv", CASES, ids=[" ".join(argv)[:60] for argv in CASES])
def test_the_command_names_a_scenario_and_its_flags_parse(argv, capsys):
    parser, _ = scenario_parser(argv[0])
    try:
        parser.parse_args(argv[1:])
    except SystemExit as exit_:
        pytest.fail(f"python -m benchmarks run {shlex.join(argv)}: {capsys.readouterr().err} (exit {exit_.code})")
