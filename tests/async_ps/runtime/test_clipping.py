import itertools

import pytest
import torch

from lightning_hetero.async_ps.runtime.clipping import GlobalNormClipping, global_norm_squared


def test_the_estimate_is_the_global_batchs_expected_squared_norm():
    # g_k = G + noise of variance s2 / b_k (per coordinate summed): E|g_k|^2 = |G|^2 + s2 / b, E<g', g> = |G|^2
    torch.manual_seed(0)
    signal, noise, share, dim = torch.randn(64), 0.5, 0.25, 64
    draws = [signal + noise * torch.randn(dim) for _ in range(20001)]
    estimates = [
        global_norm_squared(float(g.dot(g)), float(previous.dot(g)), share) for previous, g in itertools.pairwise(draws)
    ]
    # the global batch (1 / share ranks' gradients averaged) has noise variance share * noise^2 per coordinate
    expected = float(signal.dot(signal)) + share * noise**2 * dim
    assert sum(estimates) / len(estimates) == pytest.approx(expected, rel=0.02)


def test_a_binding_limit_clips_the_rank_gradient_by_the_global_batchs_factor():
    param = torch.nn.Parameter(torch.zeros(2))
    clipping = GlobalNormClipping()
    param.grad = torch.tensor([1.0, 0.0])
    clipping.to_global_norm([param], share=0.5)  # no previous gradient: the rank's own norm
    clipping.restore([param])
    param.grad = torch.tensor([0.0, 1.0])  # orthogonal to the previous: |G_B|^2 ~ 0.5
    clipping.to_global_norm([param], share=0.5)
    torch.nn.utils.clip_grad_norm_([param], 0.5)  # Lightning's clipping at gradient_clip_val=0.5
    clipping.restore([param])
    # DDP clips the global batch's gradient (norm sqrt(0.5)) by 0.5 / sqrt(0.5): the rank's gradient gets that factor
    assert param.grad.tolist() == pytest.approx([0.0, 0.5 / 0.5**0.5], rel=1e-5)  # clip_grad_norm_'s eps


def test_an_unclipped_gradient_comes_back_unchanged():
    param = torch.nn.Parameter(torch.zeros(3))
    clipping = GlobalNormClipping()
    for grad in ([1.0, 2.0, 3.0], [3.0, -1.0, 0.5]):
        param.grad = torch.tensor(grad)
        clipping.to_global_norm([param], share=0.5)
        clipping.restore([param])
        assert param.grad.tolist() == pytest.approx(grad)
