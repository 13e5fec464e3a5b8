import math

import pytest
import torch

from lightning_hetero.hetero_batch.lr_scaling import lr_scale_factor, scale_learning_rates


def test_factors():
    assert lr_scale_factor("linear", 128, 64) == 0.5
    assert math.isclose(lr_scale_factor("sqrt", 128, 512), 2.0)
    assert lr_scale_factor(None, 1, 1000) == 1.0
    with pytest.raises(ValueError, match="lr_scaling"):
        lr_scale_factor("cubic", 1, 2)


def test_scheduler_keeps_the_scaled_rate_after_stepping():
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 1.0)
    scale_learning_rates([optimizer], [scheduler], 3.0)
    optimizer.step()
    scheduler.step()
    assert math.isclose(optimizer.param_groups[0]["lr"], 0.3)
