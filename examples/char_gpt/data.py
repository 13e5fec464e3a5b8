"""Generated English-like text from a small seeded grammar, cut into fixed-length character windows.

The grammar (subject, verb, object, an optional ending) makes text whose spelling is fully predictable and whose
word choices are not, so the validation loss falls quickly and then levels off above zero. Nothing is downloaded.

Example::

    >>> generate_text(40, seed=0)
    'the teacher ignores the red ball today. '
"""

from __future__ import annotations

import random

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

SUBJECTS = ("the cat", "a dog", "the old man", "my sister", "the robot", "a small bird", "the teacher", "our cook")
VERBS = ("sees", "likes", "follows", "paints", "finds", "carries", "ignores", "remembers")
OBJECTS = ("the red ball", "a green apple", "the river", "an old book", "the moon", "a wooden box", "the garden gate")
# The empty ending is listed twice so that plain sentences are the most common kind.
ENDINGS = ("", "", " today", " at night", " in the rain", " again", " with care")
ALPHABET = "".join(sorted(set("".join(SUBJECTS + VERBS + OBJECTS + ENDINGS) + " .\n")))


def generate_text(num_chars: int, seed: int = 0) -> str:
    """``num_chars`` characters of sentences from the grammar; a newline after every fourth sentence."""
    if num_chars <= 0:
        raise ValueError(f"num_chars must be positive, got {num_chars}")
    rng = random.Random(seed)
    pieces: list[str] = []
    length = 0
    while length < num_chars:
        sentence = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}{rng.choice(ENDINGS)}."
        separator = "\n" if len(pieces) % 4 == 3 else " "
        pieces.append(sentence + separator)
        length += len(sentence) + 1
    return "".join(pieces)[:num_chars]


def encode(text: str) -> torch.Tensor:
    """Character ids in :data:`ALPHABET` (a ``long`` tensor); raises on characters outside it."""
    lookup = {char: i for i, char in enumerate(ALPHABET)}
    unknown = sorted(set(text) - lookup.keys())
    if unknown:
        raise ValueError(f"characters outside the alphabet: {unknown}")
    return torch.tensor([lookup[char] for char in text], dtype=torch.long)


def decode(ids: torch.Tensor) -> str:
    """The inverse of :func:`encode`."""
    return "".join(ALPHABET[i] for i in ids.tolist())


class CharWindows(Dataset):
    """Non-overlapping windows of ``block_size + 1`` characters as ``(input, target)``, the target shifted by one.

    Windows do not overlap, so an epoch sees each character once; that keeps "every sample once per epoch" exact
    when a sampler splits batches across ranks.

    Args:
        ids: encoded text.
        block_size: context length of each sample.
    """

    def __init__(self, ids: torch.Tensor, block_size: int) -> None:
        if len(ids) < block_size + 1:
            raise ValueError(f"text of {len(ids)} characters is shorter than one window of {block_size + 1}")
        self.ids = ids
        self.block_size = block_size

    def __len__(self) -> int:
        return (len(self.ids) - 1) // self.block_size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} out of range for {len(self)} windows")
        start = index * self.block_size
        window = self.ids[start : start + self.block_size + 1]
        return window[:-1], window[1:]


class CharTextDataModule(L.LightningDataModule):
    """Generated training and validation text (different seeds, same grammar) as :class:`CharWindows`.

    Args:
        num_chars: characters of training text; validation gets a tenth as many.
        block_size: context length of each sample; must match the model's.
        batch_size: the per-rank batch size of the train loader (HeteroBatchCallback's starting size).
        num_workers: DataLoader worker processes.
        seed: seeds the training text; the validation text uses ``seed + 1``.
    """

    vocab_size = len(ALPHABET)

    def __init__(
        self, num_chars: int = 200_000, block_size: int = 64, batch_size: int = 32, num_workers: int = 0, seed: int = 0
    ) -> None:
        super().__init__()
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if num_chars // 10 < block_size + 1:
            raise ValueError(f"num_chars={num_chars} leaves less than one validation window of {block_size + 1}")
        self.num_chars = num_chars
        self.block_size = block_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.train_set: CharWindows | None = None
        self.val_set: CharWindows | None = None

    def setup(self, stage: str) -> None:
        if self.train_set is None:
            self.train_set = CharWindows(encode(generate_text(self.num_chars, self.seed)), self.block_size)
            self.val_set = CharWindows(encode(generate_text(self.num_chars // 10, self.seed + 1)), self.block_size)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256, num_workers=self.num_workers)
