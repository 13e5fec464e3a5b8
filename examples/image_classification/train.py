"""Train an image classifier with LightningCLI; the YAML configs in ``examples/configs`` choose BSP, ASP or hybrid.

Run it with Lightning's runner, ``torchrun`` or ``python``, by path or (from the checkout's root) as a module; see
``examples/README.md`` for every mode::

    fabric run --accelerator cpu --devices 2 examples/image_classification/train.py fit \\
        --config examples/configs/resnet20.yaml --config examples/configs/bsp.yaml
    python -m examples.image_classification.train fit --config examples/configs/resnet20.yaml \\
        --config examples/configs/bsp.yaml
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:
    # Run as a file (`fabric run`, `torchrun` or `python` with this script's path), not with `-m`: put the checkout's
    # root first on the path, so that `examples` imports as a package from any working directory.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lightning.pytorch.cli import ArgsType, LightningCLI

import lightning_hetero  # noqa: F401  (importing it registers the "async_ps" strategy name)
from examples.image_classification.data import CIFAR10DataModule
from examples.image_classification.model import ImageClassifier


def main(args: ArgsType = None, run: bool = True) -> LightningCLI:
    """Parse the command line (or ``args``) and run its subcommand; with ``run=False`` only build the objects."""
    return LightningCLI(ImageClassifier, CIFAR10DataModule, args=args, run=run, save_config_kwargs={"overwrite": True})


if __name__ == "__main__":
    main()
