"""Train an image classifier with LightningCLI; the YAML configs in ``examples/configs`` choose BSP, ASP or hybrid.

Run from the repository root (see ``examples/README.md`` for every mode)::

    python -m examples.image_classification.train fit --config examples/configs/resnet20.yaml \\
        --config examples/configs/bsp.yaml
"""

from __future__ import annotations

from lightning.pytorch.cli import ArgsType, LightningCLI

import lightning_hetero  # noqa: F401  (importing it registers the "async_ps" strategy name)
from examples.image_classification.data import CIFAR10DataModule
from examples.image_classification.model import ImageClassifier


def main(args: ArgsType = None, run: bool = True) -> LightningCLI:
    """Parse the command line (or ``args``) and run its subcommand; with ``run=False`` only build the objects."""
    return LightningCLI(ImageClassifier, CIFAR10DataModule, args=args, run=run, save_config_kwargs={"overwrite": True})


if __name__ == "__main__":
    main()
