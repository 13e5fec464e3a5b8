"""One test per function in ``lightning_hetero._lightning_internals``: each fails loudly if Lightning changes the
private name or attribute the function relies on."""

from __future__ import annotations

# --- trainer, loops and data ---


# --- strategies, launchers and module state ---
