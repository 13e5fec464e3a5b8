"""The one place where lightning-hetero touches Lightning's private names and attributes.

Every other module reaches Lightning through its public API or through a small named function here. Each function
says which Lightning versions it was checked against, and ``tests/test_lightning_internals.py`` has a test per
function that fails loudly when Lightning changes the thing it relies on, so a Lightning upgrade breaks one test
with a clear name instead of silently turning a feature off.
"""

from __future__ import annotations

# --- trainer, loops and data (used by hetero_batch/, switching/, schedules.py) ---


# --- strategies, launchers and module state (used by ps/) ---
