"""torch.compile with changing batch sizes: marked dynamic, one graph; too many graphs warned about, naming the rank."""

import torch

from lightning_hetero.hetero_batch.compile_shapes import RecompileWatch, compiled_graphs, mark_batch_dynamic


def _step(x):
    return torch.tanh(x @ torch.ones(3, 2)).sum()


def test_marked_batches_of_changing_size_compile_once():
    torch._dynamo.reset()
    compiled = torch.compile(_step, backend="eager")
    watch = RecompileWatch(rank=1, bound=2)
    for size in (8, 16, 24, 40, 56):
        x = torch.ones(size, 3)
        assert mark_batch_dynamic((x, [x]), size) == 2
        compiled(x)
    assert watch.check() == 1 and not watch.warned


def test_unmarked_sizes_recompile_and_the_rank_is_named(caplog):
    torch._dynamo.reset()
    compiled = torch.compile(_step, backend="eager", dynamic=False)
    watch = RecompileWatch(rank=1, bound=2)
    before = compiled_graphs()
    for size in (8, 16, 24, 40):
        compiled(torch.ones(size, 3))
    assert compiled_graphs() - before == 4
    assert watch.check() == 4 and watch.warned
    assert "rank 1 has compiled 4 graphs" in caplog.text


def test_sizes_under_two_are_not_marked():
    assert mark_batch_dynamic({"x": torch.ones(1, 3)}, 1) == 0
