"""The character GPT example's model and data, without a Trainer."""

import pytest
import torch
from examples.char_gpt.data import ALPHABET, CharTextDataModule, CharWindows, decode, encode, generate_text
from examples.char_gpt.model import CharGPT


def small_model(**overrides) -> CharGPT:
    torch.manual_seed(0)
    config = dict(vocab_size=len(ALPHABET), block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0)
    return CharGPT(**{**config, **overrides}).eval()


def test_forward_gives_logits_per_position():
    model = small_model()
    assert model(torch.randint(len(ALPHABET), (3, 16))).shape == (3, 16, len(ALPHABET))
    assert model(torch.randint(len(ALPHABET), (3, 5))).shape == (3, 5, len(ALPHABET))


def test_future_tokens_do_not_affect_past_logits():
    model = small_model()
    tokens = torch.randint(len(ALPHABET), (2, 16), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % len(ALPHABET)
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    torch.testing.assert_close(after[:, :10], before[:, :10])
    assert not torch.allclose(after[:, 10:], before[:, 10:])


def test_head_is_tied_to_the_token_embedding():
    model = small_model()
    assert model.head.weight is model.token_embedding.weight


def test_bad_shapes_are_named_in_the_error():
    with pytest.raises(ValueError, match="exceeds block_size"):
        small_model()(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="multiple of n_head"):
        small_model(n_embd=30, n_head=4)


def test_generate_extends_the_prompt_within_the_alphabet():
    out = small_model().generate(encode("the ").unsqueeze(0), max_new_tokens=20)
    assert out.shape == (1, 24)
    assert decode(out[0]).startswith("the ")


def test_generated_text_is_seeded_and_in_the_alphabet():
    text = generate_text(1000, seed=1)
    assert len(text) == 1000
    assert text == generate_text(1000, seed=1)
    assert text != generate_text(1000, seed=2)
    assert set(text) <= set(ALPHABET)
    assert decode(encode(text)) == text
    with pytest.raises(ValueError, match="outside the alphabet"):
        encode("The")


def test_windows_cover_the_text_once_with_targets_shifted_by_one():
    ids = encode(generate_text(101))
    windows = CharWindows(ids, block_size=10)
    assert len(windows) == 10
    for index in range(len(windows)):
        x, y = windows[index]
        torch.testing.assert_close(x, ids[index * 10 : index * 10 + 10])
        torch.testing.assert_close(y, ids[index * 10 + 1 : index * 10 + 11])
    with pytest.raises(IndexError):
        windows[10]


def test_datamodule_exposes_vocabulary_and_batches():
    dm = CharTextDataModule(num_chars=2000, block_size=16, batch_size=4)
    assert dm.vocab_size == len(ALPHABET)
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == y.shape == (4, 16)
    with pytest.raises(ValueError, match="validation window"):
        CharTextDataModule(num_chars=100, block_size=16)
