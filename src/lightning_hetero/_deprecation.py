"""Old names kept for one release after a rename (a ``DeprecationWarning`` when used), per the project's rule."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any


def renamed_argument(owner: str, old: str, new: str, old_value: Any, new_value: Any, default: Any = None) -> Any:
    """The value of argument ``new``, taking it from the deprecated ``old`` when only that one was given.

    Example::

        >>> import warnings
        >>> renamed_argument("f", "a", "b", old_value=None, new_value=2)
        2
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     renamed_argument("f", "a", "b", old_value=3, new_value=None)
        3
        >>> str(caught[0].message)
        'f(a=...) is deprecated and will be removed in the next release; use f(b=...)'
    """
    if old_value is default:
        return new_value
    if new_value is not default:
        raise TypeError(f"{owner}: give {new} only ({old} is its deprecated old name)")
    warn_renamed(f"{owner}({old}=...)", f"{owner}({new}=...)", stacklevel=4)
    return old_value


def moved_keywords(owner: str, advanced_type: type, knobs: set[str], advanced: Any, old: dict[str, Any]) -> Any:
    """``advanced`` (default: ``advanced_type()``) with the deprecated keywords in ``old`` taken in: ``owner``'s
    former arguments that are now fields of its ``advanced=`` settings (``knobs``, their names). Each one warns
    (removed in the next release) and takes effect.

    Raises:
        TypeError: a keyword that never was one, or an old keyword given with ``advanced``.

    Example::

        >>> import warnings
        >>> from dataclasses import dataclass
        >>> @dataclass(frozen=True)
        ... class Knobs:
        ...     seed: int = 0
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     moved_keywords("f", Knobs, {"seed"}, None, {"seed": 3})
        Knobs(seed=3)
        >>> str(caught[0].message)
        'f(seed=...) is deprecated and will be removed in the next release; use f(advanced=Knobs(seed=...))'
        >>> moved_keywords("f", Knobs, {"seed"}, None, {"sede": 3})
        Traceback (most recent call last):
        ...
        TypeError: f() got an unexpected keyword argument 'sede'
    """
    for name in old:
        if name not in knobs:
            raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}")
        if advanced is not None:
            raise TypeError(f"{owner}: give advanced only ({name} is a deprecated old keyword)")
        # stacklevel 5: the line constructing the owner (through its settings module and this function)
        warn_renamed(f"{owner}({name}=...)", f"{owner}(advanced={advanced_type.__name__}({name}=...))", stacklevel=5)
    if advanced is not None:  # given as it is (its type checked by the owner's settings)
        return advanced
    return replace(advanced_type(), **old)


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """Warn that ``old`` was renamed ``new`` and goes away in the next release."""
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release; use {new}", DeprecationWarning, stacklevel
    )


def renamed_attributes(module: str, renamed: dict[str, tuple[str, Any]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving each old name in ``renamed`` (``old: (new name, value)``) with a warning.

    Example::

        >>> import warnings
        >>> __getattr__ = renamed_attributes("pkg.mod", {"Old": ("New", int)})
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     __getattr__("Old")
        <class 'int'>
        >>> str(caught[0].message)
        'pkg.mod.Old is deprecated and will be removed in the next release; use New'
    """

    def __getattr__(name: str) -> Any:
        if name not in renamed:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new, value = renamed[name]
        warn_renamed(f"{module}.{name}", new)
        return value

    return __getattr__
