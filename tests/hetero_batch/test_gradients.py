"""The big batch's gradient: the batch-weighted mean equals the big-batch gradient (the [3, 13] check, on CPU/gloo),
under gradient accumulation, and over a batch run in chunks of batch_size_multiple's multiples."""

import copy

import pytest
import torch
from torch import nn
from torch.autograd import Variable

from lightning_hetero.batch_weighting import averaged_weight, weight_backward
from lightning_hetero.hetero_batch.batches import HeteroBatchSampler, SplitPlan
from lightning_hetero.hetero_batch.gradients import (
    chunk_size,
    run_in_chunks,
    split_batch,
    step_weight,
    window,
)
from lightning_hetero.synthetic import MLPClassifier, make_classification
from tests.helpers import read_json


def one_big_batch_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float) -> dict:
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    return model.state_dict()


def plain_mean_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float, split: int) -> dict:
    """What DDP's unweighted mean of the two ranks' gradients would give."""
    model = copy.deepcopy(model)
    for part in (slice(0, split), slice(split, None)):
        (0.5 * nn.functional.cross_entropy(model(x[part]), y[part])).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    return model.state_dict()


GPU_RUNS = [
    pytest.param(
        ["--accelerator", "cuda", "--strategy", strategy],
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices (NCCL, one rank each)"),
        ],
        id=f"cuda-{strategy}",
    )
    for strategy in ("ddp", "fsdp")
]


@pytest.mark.multiprocess
@pytest.mark.parametrize("options", [pytest.param([], id="cpu-ddp"), *GPU_RUNS])
def test_weighted_mean_matches_the_concatenated_batch(run_script, tmp_path, options):
    run_script("hetero_train.py", str(tmp_path), "grad", *options)
    assert [read_json(tmp_path / f"grad_rank{r}.json")["local_sizes"] for r in range(2)] == [[3], [13]]
    trained = {name: value.cpu() for name, value in torch.load(tmp_path / "params.pt").items()}

    torch.manual_seed(0)
    reference = MLPClassifier(num_features=8, num_classes=3, lr=0.5)
    x, y = make_classification(16, num_features=8, num_classes=3, seed=1).tensors
    expected = one_big_batch_step(reference, x, y, lr=0.5)
    unweighted = plain_mean_step(reference, x, y, lr=0.5, split=3)

    for name, value in expected.items():
        torch.testing.assert_close(trained[name], value, atol=1e-5, rtol=0)
    # the check can fail: DDP's plain mean lands measurably elsewhere
    assert max((unweighted[n] - expected[n]).abs().max() for n in expected) > 1e-3


def big_batch_gradient(params: dict, x: torch.Tensor, y: torch.Tensor, weights=None) -> dict:
    """The gradient of the mean loss over ``x`` at ``params`` in float64; with ``weights`` (one per part of a list of
    ``(x, y)`` parts instead), the weighted sum of the parts' mean-loss gradients."""
    model = MLPClassifier(num_features=8, num_classes=3).double()
    model.load_state_dict(params, strict=False)
    parts = [(x, y)] if weights is None else list(zip(x, y, strict=True))
    for (xs, ys), w in zip(parts, weights or [1.0], strict=True):
        (w * nn.functional.cross_entropy(model(xs), ys)).backward()
    return {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.multiprocess
def test_loss_weighting_gives_the_big_batch_gradient_across_a_split_change(run_script, tmp_path):
    """Each rank back-propagates N b_k / B from its loss and DDP's built-in all-reduce averages: in float64 the
    gradient is the big batch's to 1e-12 at every step, before and after the split changes, and gradient clipping
    (which acts on the all-reduced gradient) moves the parameters as on one big batch."""
    run_script("hetero_train.py", str(tmp_path), "exact")
    traces = [torch.load(tmp_path / f"trace_rank{r}.pt") for r in range(2)]
    sizes = [[len(step["y"]) for step in trace["steps"]] for trace in traces]
    assert sizes[0][0] == 3 and sizes[0][-1] == 11 and [a + b for a, b in zip(*sizes, strict=True)] == [16] * 4
    steps = list(zip(traces[0]["steps"], traces[1]["steps"], strict=True))
    after = [s0["params"] for s0, _ in steps[1:]] + [traces[0]["final"]]
    for (s0, s1), params_after in zip(steps, after, strict=True):
        assert s0["x"].dtype == torch.float64
        torch.testing.assert_close(s1["params"], s0["params"], atol=0, rtol=0)  # the ranks stay in lock-step
        x, y = torch.cat([s0["x"], s1["x"]]), torch.cat([s0["y"], s1["y"]])
        expected = big_batch_gradient(s0["params"], x, y)
        for rank_step in (s0, s1):
            torch.testing.assert_close(rank_step["grads"], expected, atol=1e-12, rtol=0)
        # the check can fail: DDP's plain mean of the two local means lands measurably elsewhere
        plain = big_batch_gradient(s0["params"], [s0["x"], s1["x"]], [s0["y"], s1["y"]], weights=[0.5, 0.5])
        assert max((plain[n] - expected[n]).abs().max() for n in expected) > 1e-3
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in expected.values()]))
        clip = min(1.0, 0.05 / (float(norm) + 1e-6))
        assert clip < 1.0, "the clipping is active"
        stepped = {name: p - 0.5 * clip * expected[name] for name, p in s0["params"].items()}
        torch.testing.assert_close(params_after, stepped, atol=1e-12, rtol=0)


@pytest.mark.multiprocess
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_manual_optimization_steps_as_one_process_on_the_big_batch(run_script, tmp_path, optimizer):
    """``self.automatic_optimization = False`` (``zero_grad``, ``manual_backward``, ``step``) under DDP with shares
    [3, 13] then [11, 5], Lightning's defaults on: each rank's ``manual_backward`` is weighted as the automatic one
    is, so in float64 the gradient is the big batch's at every step, and the user's optimizer (SGD, Adam) moves the
    parameters as it does in one process on the same global batches."""
    run_script("hetero_train.py", str(tmp_path), "manual", "--optimizer", optimizer)
    traces = [torch.load(tmp_path / f"trace_rank{r}.pt") for r in range(2)]
    sizes = [[len(step["y"]) for step in trace["steps"]] for trace in traces]
    assert sizes[0][0] == 3 and sizes[0][-1] == 11 and [a + b for a, b in zip(*sizes, strict=True)] == [16] * 4
    assert read_json(tmp_path / "manual_rank0.json")["global_step"] == 4
    reference = MLPClassifier(num_features=8, num_classes=3).double()
    reference.load_state_dict(traces[0]["steps"][0]["params"], strict=False)
    params = dict(reference.named_parameters())
    if optimizer == "adam":
        stepper = torch.optim.Adam(reference.parameters(), lr=0.05)
    else:
        stepper = torch.optim.SGD(reference.parameters(), lr=0.5)
    plain_gaps = []
    for s0, s1 in zip(traces[0]["steps"], traces[1]["steps"], strict=True):
        torch.testing.assert_close(s1["params"], s0["params"], atol=0, rtol=0)  # the ranks stay in lock-step
        torch.testing.assert_close(s0["params"], {n: p.detach() for n, p in params.items()}, atol=1e-10, rtol=0)
        x, y = torch.cat([s0["x"], s1["x"]]), torch.cat([s0["y"], s1["y"]])
        stepper.zero_grad()
        nn.functional.cross_entropy(reference(x), y).backward()
        expected = {name: p.grad for name, p in params.items()}
        for rank_step in (s0, s1):
            torch.testing.assert_close(rank_step["grads"], expected, atol=1e-12, rtol=0)
        plain = big_batch_gradient(s0["params"], [s0["x"], s1["x"]], [s0["y"], s1["y"]], weights=[0.5, 0.5])
        plain_gaps.append(max(float((plain[n] - expected[n]).abs().max()) for n in expected))
        stepper.step()
    assert max(plain_gaps) > 1e-3  # the check can fail: DDP's plain mean of the local means lands measurably elsewhere
    torch.testing.assert_close(traces[0]["final"], {n: p.detach() for n, p in params.items()}, atol=1e-10, rtol=0)


def test_a_loss_back_propagated_twice_is_weighted_once_each_time():
    # manual optimization may call manual_backward(loss, retain_graph=True) on the same loss again
    model, x = nn.Linear(4, 2), torch.randn(5, 4)
    loss = nn.functional.mse_loss(model(x), torch.zeros(5, 2))
    marks = []
    grads = []
    for _ in range(2):
        weight_backward(loss, 0.375, lambda: marks.append("end"))
        loss.backward(retain_graph=True)
        grads.append(model.weight.grad.clone())
        model.zero_grad()
    torch.testing.assert_close(grads[1], grads[0])
    assert marks == ["end", "end"]
    model.zero_grad()
    loss.backward(retain_graph=True)  # the hook stays on the loss
    torch.testing.assert_close(model.weight.grad, grads[0])


def test_the_end_of_compute_is_marked_before_ddps_final_callback():
    """DDP queues its final callback (which waits for the all-reduce) from a gradient hook during backward; the
    loss's hook queues the mark earlier, so the engine runs it first: the wait is not counted as compute."""
    model, x = nn.Linear(4, 2), torch.randn(5, 4)
    order = []
    model.weight.register_hook(lambda g: Variable._execution_engine.queue_callback(lambda: order.append("ddp")))
    loss = nn.functional.mse_loss(model(x), torch.zeros(5, 2))
    weight_backward(loss, 0.375, lambda: order.append("compute end"))
    loss.backward()
    assert order == ["compute end", "ddp"]


def test_weight_one_leaves_the_gradients_bitwise_unchanged_and_composes_with_a_grad_scaler():
    torch.manual_seed(0)
    model, x = nn.Linear(4, 2), torch.randn(5, 4)
    nn.functional.mse_loss(model(x), torch.zeros(5, 2)).backward()
    plain = [p.grad.clone() for p in model.parameters()]
    for weight in (1.0, 0.375):
        model.zero_grad()
        marks = []
        loss = nn.functional.mse_loss(model(x), torch.zeros(5, 2))
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        scaled = scaler.scale(loss)  # a precision plugin scales before `on_before_backward` sees the loss
        weight_backward(scaled, weight, lambda marks=marks: marks.append("end"))
        scaled.backward()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler.unscale_(optimizer)
        assert marks == ["end"]
        for got, want in zip((p.grad for p in model.parameters()), plain, strict=True):
            if weight == 1.0:
                assert torch.equal(got, want)
            else:
                torch.testing.assert_close(got, weight * want)


def _gradient(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, weight: float) -> torch.Tensor:
    model.zero_grad()
    (weight * torch.nn.functional.cross_entropy(model(x), y)).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone()


@pytest.mark.parametrize("accumulate", [1, 2, 4])
def test_accumulated_steps_are_the_big_batch_gradient_over_all_micro_batches(accumulate):
    """Lightning divides each micro-batch's loss by ``accumulate`` and DDP averages the ranks: with the weights of
    ``step_weight`` each optimizer step's gradient is the gradient of all its micro-batches' samples together, also
    when the split changes inside a window and for the epoch's last, short window and global batch."""
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    x, y = torch.randn(45, 5), torch.randint(0, 3, (45,))  # 5 global batches of 8, then a short one of 5
    plan = SplitPlan([5, 3])
    plan.change_at(3, [6, 2])
    samplers = [HeteroBatchSampler(x, plan, rank=rank, shuffle=True, seed=1) for rank in (0, 1)]
    batches = [list(sampler) for sampler in samplers]
    steps = len(samplers[0])
    assert steps == 6 and sum(samplers[0].sizes_at(0, steps - 1)) == 5
    checked = 0
    for first in range(0, steps, accumulate):
        steps_in_window = window(first, accumulate, steps)
        accumulated = torch.zeros(sum(p.numel() for p in model.parameters()))
        for step in steps_in_window:
            sizes = samplers[0].sizes_at(0, step)
            for rank in (0, 1):
                weight = step_weight(sizes, rank, step, accumulate, steps, lambda s: sum(samplers[0].sizes_at(0, s)))
                index = batches[rank][step]
                accumulated += _gradient(model, x[index], y[index], weight / accumulate) / 2  # DDP: the mean
        everything = [i for step in steps_in_window for rank in (0, 1) for i in batches[rank][step]]
        torch.testing.assert_close(accumulated, _gradient(model, x[everything], y[everything], 1.0))
        checked += 1
    assert checked == -(-steps // accumulate)


def test_without_the_window_total_the_short_last_window_would_be_wrong():
    """The per-step weight alone (``averaged_weight``) is what the window's weight gives for full windows only."""
    sizes, steps = (3, 2), 6
    full = step_weight(sizes, 0, 1, 2, steps, lambda s: 8)
    assert full == pytest.approx(averaged_weight(sizes, 0) * 5 / 8)  # a step of 5 in a window of 8-sample steps
    last = step_weight(sizes, 0, 5, 2, steps, lambda s: 8 if s < 5 else 5)
    assert last == pytest.approx(2 * 2 * 3 / 13) and last != pytest.approx(averaged_weight(sizes, 0))


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
