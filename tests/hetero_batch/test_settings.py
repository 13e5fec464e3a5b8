import pytest

from lightning_hetero.hetero_batch.settings import check_settings

GOOD = dict(
    global_batch_size=64,
    initial_batch_sizes=None,
    min_batch_size=1,
    max_batch_size=None,
    deadband=0.05,
    smoothing=0.5,
    adjust_every_n_steps=None,
    batch_lr_scaling=None,
    rollback_tolerance=0.15,
    change_tolerance=0.4,
)


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ({"min_batch_size": 0}, "min_batch_size"),
        ({"max_batch_size": [4, 0]}, "max_batch_size"),
        ({"global_batch_size": 0}, "global_batch_size"),
        ({"initial_batch_sizes": [32, 0]}, "initial_batch_sizes"),
        ({"adjust_every_n_steps": 0}, "adjust_every_n_steps"),
        ({"deadband": -0.1}, "deadband"),
        ({"smoothing": float("nan")}, "smoothing"),
        ({"batch_lr_scaling": "cubic"}, "batch_lr_scaling"),
        ({"rollback_tolerance": float("inf")}, "rollback_tolerance"),
        ({"change_tolerance": 0}, "change_tolerance"),
    ],
)
def test_each_bad_setting_is_named(bad, named):
    check_settings(**GOOD)
    with pytest.raises(ValueError, match=named):
        check_settings(**GOOD | bad)
