"""Train the character GPT with LightningCLI; the YAML configs in ``examples/configs`` choose BSP, ASP or hybrid.

Run it with Lightning's runner, ``torchrun`` or ``python``, by path or (from the checkout's root) as a module; see
``examples/README.md`` for every mode::

    fabric run --accelerator cpu --devices 2 examples/char_gpt/train.py fit \\
        --config examples/configs/char_gpt.yaml --config examples/configs/bsp.yaml
    python -m examples.char_gpt.train fit --config examples/configs/char_gpt.yaml --config examples/configs/bsp.yaml
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:
    # Run as a file (`fabric run`, `torchrun` or `python` with this script's path), not with `-m`: put the checkout's
    # root first on the path, so that `examples` imports as a package from any working directory.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info

import lightning_hetero  # noqa: F401  (importing it registers the "async_ps" strategy name)
from examples.char_gpt.data import CharTextDataModule, decode, encode
from examples.char_gpt.model import CharGPT


class CharGPTCLI(LightningCLI):
    """LightningCLI that takes the vocabulary and context length from the data, and shows a sample after fit."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.block_size", "model.block_size")
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")

    def after_fit(self) -> None:
        if not self.trainer.is_global_zero:
            return
        self.model.eval()
        prompt = encode("the ").unsqueeze(0).to(self.model.device)
        sample = decode(self.model.generate(prompt, max_new_tokens=120, temperature=0.8)[0])
        rank_zero_info(f"sample after training:\n{sample}")


def main(args: ArgsType = None, run: bool = True) -> LightningCLI:
    """Parse the command line (or ``args``) and run its subcommand; with ``run=False`` only build the objects."""
    return CharGPTCLI(CharGPT, CharTextDataModule, args=args, run=run, save_config_kwargs={"overwrite": True})


if __name__ == "__main__":
    main()
