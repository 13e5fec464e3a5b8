"""Sphinx extension: a documented argument that the signature does not have is a warning (an error under ``-W``).

Napoleon renders a Google ``Args:`` section as it is written and autodoc does not compare it with the signature, so
on their own a renamed argument would leave a stale entry and build cleanly. This compares the names in each
``Args:`` section of a documented class or function with the parameters of its signature (for a class, its
``__init__``), both ways:

- an ``Args:`` entry that names no parameter -> warning (the renamed or removed argument);
- a parameter missing from an ``Args:`` section that exists -> warning (the new name nobody documented).

Callables without an ``Args:`` section are not checked (many small methods document their arguments in prose).

It also fails the build when a name ``lightning_hetero.__all__`` exports has no entry in the reference.
"""

from __future__ import annotations

import inspect
import re

from sphinx.util import logging

logger = logging.getLogger(__name__)

SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters|Keyword Args|Keyword Arguments):\s*$")
ENTRY = re.compile(r"^(\*{0,2}\w+)\s*(\([^)]*\))?\s*:")


def documented_args(lines: list[str]) -> list[str] | None:
    """The argument names of the Google-style ``Args:`` sections in ``lines`` (``None`` when there is none)."""
    names: list[str] | None = None
    index = 0
    while index < len(lines):
        match = SECTION.match(lines[index])
        index += 1
        if not match:
            continue
        names = names or []
        section_indent = len(match.group(1))
        entry_indent = None
        while index < len(lines):
            line = lines[index]
            if line.strip():
                indent = len(line) - len(line.lstrip())
                if indent <= section_indent:
                    break
                if entry_indent is None:
                    entry_indent = indent
                if indent == entry_indent:
                    entry = ENTRY.match(line.strip())
                    if entry:
                        names.append(entry.group(1).lstrip("*"))
            index += 1
    return names


def signature_params(obj: object, what: str) -> set[str] | None:
    target = obj.__init__ if what == "class" else obj
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    return {name for name in signature.parameters if name not in ("self", "cls")}


def check(app, what, name, obj, options, lines) -> None:
    _documented.add(name)
    if what not in ("class", "function", "method"):
        return
    raw = inspect.getdoc(obj) or ""
    documented = documented_args(raw.splitlines())
    if documented is None:
        return
    params = signature_params(obj, what)
    if params is None:
        return
    location = f"{name}: "
    for arg in documented:
        if arg not in params:
            logger.warning(f"{location}'Args:' documents {arg!r}, which is not a parameter of the signature")
    for param in sorted(params - set(documented)):
        kind = inspect.signature(obj.__init__ if what == "class" else obj).parameters[param].kind
        if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        logger.warning(f"{location}parameter {param!r} is missing from its 'Args:' section")


_documented: set[str] = set()


def check_coverage(app, env) -> None:
    import lightning_hetero

    public = {f"lightning_hetero.{name}" for name in lightning_hetero.__all__ if not name.startswith("_")}
    for missing in sorted(public - _documented):
        logger.warning(f"{missing} is exported by lightning_hetero but has no entry in the API reference")


def setup(app):
    app.connect("autodoc-process-docstring", check)
    app.connect("env-check-consistency", check_coverage)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
