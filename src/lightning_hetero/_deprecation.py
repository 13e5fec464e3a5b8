"""Old names kept for one release after a rename (a ``DeprecationWarning`` when used), per the project's rule."""

from __future__ import annotations

import warnings
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


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """Warn that ``old`` was renamed ``new`` and goes away in the next release."""
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release; use {new}", DeprecationWarning, stacklevel
    )
