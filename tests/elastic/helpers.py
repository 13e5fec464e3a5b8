"""What the elastic strategies' tests share: a one-device CPU trainer with Lightning's progress bar and model summary
on, as users run it."""

from __future__ import annotations

from typing import Any

import lightning as L


def cpu_trainer(strategy: Any, epochs: int, **kwargs: Any) -> L.Trainer:
    """A one-device CPU trainer with ``strategy`` for ``epochs`` epochs; no logger, sanity check or checkpointing
    (they write into the working directory) unless ``kwargs`` turn them on."""
    settings = {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": epochs,
        "logger": False,
        "num_sanity_val_steps": 0,
        "enable_checkpointing": False,
    }
    return L.Trainer(strategy=strategy, **(settings | kwargs))
