"""chunking: a batch over its memory cap in chunks of batch_size_multiple's multiples, with the big batch's gradient."""

import torch

from lightning_hetero.hetero_batch.chunking import chunk_size, run_in_chunks, split_batch


def test_chunks_are_the_largest_multiple_within_the_cap_unless_none_fits():
    assert [chunk_size(cap, 8) for cap in (7, 8, 15, 16, 23)] == [7, 8, 8, 16, 16]
    assert chunk_size(18, 1) == 18 and chunk_size(0, 8) == 1


def test_batches_split_along_their_first_dimension():
    pieces = split_batch({"x": torch.zeros(5, 2), "n": 3}, size=5, chunk=3)
    assert [p["x"].shape[0] for p in pieces] == [3, 2] and pieces[1]["n"] == 3


def test_a_batch_in_chunks_gives_the_big_batchs_gradient_and_loss():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    x, y = torch.randn(10, 3), torch.randn(10, 2)

    def step(batch):
        return {"loss": torch.nn.functional.mse_loss(model(batch[0]), batch[1])}

    whole = step((x, y))["loss"]
    expected = torch.autograd.grad(whole, list(model.parameters()))
    out = run_in_chunks(step, step, None, model, (x, y), size=10, chunk=4, args=(), kw={})
    out["loss"].backward()
    torch.testing.assert_close(out["loss"].detach(), whole.detach())
    for param, grad in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(param.grad, grad)
