import lightning as L
import pytest

from lightning_hetero.hetero_batch.settings import check_settings, check_trainer
from lightning_hetero.synthetic import MLPClassifier

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


class _Manual(MLPClassifier):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False


def _trainer() -> L.Trainer:
    return L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)


def test_manual_optimization_is_accepted_but_not_with_automatic_memory_caps():
    check_trainer(_trainer(), _Manual())  # its manual_backward is weighted by the rank's share
    check_trainer(_trainer(), _Manual(), memory_caps=[16])
    with pytest.raises(ValueError, match=r"memory_caps='auto'\) needs automatic optimization.*one size per rank"):
        check_trainer(_trainer(), _Manual(), memory_caps="auto")
    check_trainer(_trainer(), MLPClassifier(), memory_caps="auto")
