"""lightning-hetero: PyTorch Lightning plugins for training on heterogeneous clusters."""

from lightning_hetero.__about__ import __version__

__all__ = ["__version__"]
