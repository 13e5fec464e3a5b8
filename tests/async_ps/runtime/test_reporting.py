import pytest
import torch

from lightning_hetero.asp.compensation import AsynchronyCompensator
from lightning_hetero.async_ps.runtime.reporting import (
    EpochLog,
    compensation_message,
    report_hyperparameters,
    report_staleness,
)


class RecordingModule:
    """Stands in for a LightningModule: records what ``log`` is given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def log(self, name, value, **kwargs):
        self.calls.append((name, kwargs))


def gather_from(*other_ranks: float):
    """An all-gather in which the other ranks hold ``other_ranks`` for every state (the same value for each)."""

    def gather(tensor: torch.Tensor) -> torch.Tensor:
        others = [torch.full_like(tensor, value) for value in other_ranks]
        return torch.stack([tensor, *others])

    return gather


def test_the_message_names_the_compensated_values_beside_the_users():
    compensator = AsynchronyCompensator("auto", workers=4)
    compensator.apply([{"lr": 0.1, "momentum": 0.9}])
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1, momentum=0.9)
    message = compensation_message(sgd, compensator, "auto")
    assert "asynchrony_compensation='auto'" in message and "(yours 0.9)" in message and "(yours 0.1)" in message
    assert f"momentum {compensator.momentum_effective:.4g}" in message


def test_a_statistic_is_logged_once_an_epoch_and_updated_at_every_report():
    log, module = EpochLog(gather=gather_from()), RecordingModule()
    for epoch, values in ((0, (1, 2, 3)), (1, (7,))):
        for value in values:
            report_staleness(log, module, value, epoch)
    assert [name for name, _ in module.calls] == ["ps/staleness", "ps/staleness_max"] * 2
    assert all(kw["on_step"] is False and kw["on_epoch"] is True for _, kw in module.calls)
    # Lightning resets the metrics at each epoch's end; without a Trainer they kept every value
    assert float(log.metric("ps/staleness").compute()) == pytest.approx(13 / 4)
    assert float(log.metric("ps/staleness_max").compute()) == 7


def test_synchronised_statistics_combine_every_ranks_updates():
    # every state of the other rank is 4: a total of 4 over 4 updates (mean 1), a maximum of 4
    log, module = EpochLog(gather=gather_from(4.0)), RecordingModule()
    for value in (2, 2):
        report_staleness(log, module, value, epoch=0)
    assert float(log.metric("ps/staleness").compute()) == pytest.approx((2 + 2 + 4) / (2 + 4))
    assert float(log.metric("ps/staleness_max").compute()) == 4


def test_hyperparameters_are_rank_zeros_own_and_skip_what_is_not_a_number():
    log, module = EpochLog(gather=gather_from(100.0)), RecordingModule()
    for lr in (0.1, 0.3):
        report_hyperparameters(log, module, {"lr": lr}, None, epoch=0)
    # plain SGD has no momentum: only the learning rate is reported; not gathered from other ranks
    assert [(name, kw["rank_zero_only"]) for name, kw in module.calls] == [("ps/lr_effective", True)]
    assert float(log.metric("ps/lr_effective").compute()) == pytest.approx(0.2)


def test_the_compensators_values_are_reported_in_asp():
    compensator = AsynchronyCompensator("auto", workers=4)
    compensator.apply([{"lr": 0.1, "momentum": 0.9}])
    log, module = EpochLog(gather=gather_from()), RecordingModule()
    report_hyperparameters(log, module, {"lr": 0.1, "momentum": 0.9}, compensator, epoch=0)
    momentum = float(log.metric("ps/momentum_effective").compute())
    assert momentum == pytest.approx(compensator.momentum_effective) and momentum < 0.9


def test_restart_forgets_an_interrupted_epoch():
    log, module = EpochLog(gather=gather_from()), RecordingModule()
    report_staleness(log, module, 9, epoch=0)
    log.restart()
    report_staleness(log, module, 1, epoch=0)
    assert len(module.calls) == 4  # logged again: a new fit's result collection does not hold the metrics
    assert float(log.metric("ps/staleness_max").compute()) == 1
