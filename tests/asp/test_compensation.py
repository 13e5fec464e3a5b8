import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lightning_hetero.asp.compensation import (
    AsynchronyCompensator,
    Compensation,
    check_compensation_mode,
    compensated_lr_factor,
    compensated_momentum,
    momentum_of,
    unsupported_reason,
)


def test_one_worker_needs_no_compensation():
    assert compensated_momentum(0.9, 1.0) == pytest.approx(0.9)
    assert compensated_lr_factor(0.9, 1.0) == 1.0
    assert compensated_lr_factor(0.0, 1.0) == 1.0


@given(st.floats(0.0, 0.99), st.floats(1.0, 64.0))
def test_explicit_and_implicit_momentum_compose_to_the_users_while_momentum_lasts(momentum, n_eff):
    explicit = compensated_momentum(momentum, n_eff)
    implicit = 1.0 - 1.0 / n_eff
    assert 0.0 <= explicit <= momentum + 1e-12
    if explicit > 0:
        # momenta compose as 1 - (1 - a)(1 - b)
        assert 1.0 - (1.0 - explicit) * (1.0 - implicit) == pytest.approx(momentum)


@given(st.floats(0.0, 0.99), st.floats(1.0, 64.0))
def test_each_gradients_total_step_is_one_nth_of_a_bsp_updates(momentum, n_eff):
    # heavy ball moves a gradient by lr / (1 - mu) in total; BSP applies lr to the mean of N gradients
    explicit = compensated_momentum(momentum, n_eff)
    factor = compensated_lr_factor(momentum, n_eff)
    assert factor <= 1.0
    assert factor / (1.0 - explicit) == pytest.approx(1.0 / (n_eff * (1.0 - momentum)))


@given(st.floats(0.0, 0.99), st.integers(1, 16))
def test_with_two_gradients_in_flight_per_worker_a_gradient_still_steps_one_nth_of_a_bsp_update(momentum, workers):
    # overlap_round_trip: N_eff = 2 N; the momentum absorbs the extra staleness, the step is sized by N (at most lr)
    n_eff = 2.0 * workers
    explicit = compensated_momentum(momentum, n_eff)
    factor = compensated_lr_factor(momentum, n_eff, averaged=workers)
    assert factor <= 1.0
    per_gradient = factor / (1.0 - explicit)
    assert per_gradient == pytest.approx(min(1.0 / (1.0 - explicit), 1.0 / (workers * (1.0 - momentum))))


def test_plain_sgd_with_overlap_steps_as_far_per_sample_as_bsp():
    # two workers, each with two gradients in flight (staleness 3): lr / 2, not lr / 4
    compensator = AsynchronyCompensator("auto", workers=4, averaged=2)
    group = {"lr": 0.1, "momentum": 0.0}
    compensator.apply([group])
    assert group["lr"] == pytest.approx(0.05)


def test_staleness_one_is_damped_for_plain_sgd():
    # lr / max(1, tau) leaves tau = 1 undamped; two workers (mean staleness 1) halve plain SGD's step
    compensator = AsynchronyCompensator("auto", workers=2)
    group = {"lr": 0.1, "momentum": 0.0}
    compensator.apply([group])
    assert group == {"lr": pytest.approx(0.05), "momentum": 0.0}


def test_n_eff_follows_the_measured_staleness_from_the_worker_count():
    compensator = AsynchronyCompensator("auto", workers=8, smoothing=0.1)
    assert compensator.n_eff == 8.0
    for _ in range(200):
        compensator.observe(1)
    assert compensator.n_eff == pytest.approx(2.0, abs=1e-6)
    compensator.reset()
    assert compensator.n_eff == 8.0


def test_apply_rewrites_every_group_and_reports_the_first():
    compensator = AsynchronyCompensator("auto", workers=4)
    groups = [{"lr": 0.1, "momentum": 0.9, "nesterov": False}, {"lr": 0.5, "momentum": 0.5}]
    compensator.apply(groups)
    assert groups[0] == {"lr": 0.1, "momentum": pytest.approx(0.6), "nesterov": False}
    assert groups[1] == {"lr": pytest.approx(0.25), "momentum": 0.0}
    assert (compensator.momentum_effective, compensator.lr_effective) == (pytest.approx(0.6), 0.1)


def test_adam_beta1_is_lowered_and_beta2_kept():
    compensator = AsynchronyCompensator("auto", workers=2)
    group = {"lr": 1e-3, "betas": (0.9, 0.999)}
    compensator.apply([group])
    assert group["betas"] == (pytest.approx(0.8), 0.999)
    assert group["lr"] == 1e-3


def test_delay_compensation_corrects_towards_the_current_parameters():
    compensator = AsynchronyCompensator("dc", workers=2, dc_lambda=0.5, dc_smoothing=1.0)
    grad = torch.tensor([1.0, -2.0, 0.0])
    now, stale = torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0.0, 2.0, 0.0])
    compensator.compensate_delay(grad, now, stale)
    # g + 0.5 * g * g / |g| * (now - stale)
    assert grad.tolist() == pytest.approx([1.5, -3.0, 0.0])
    assert compensator.delay_compensation and not AsynchronyCompensator("auto", 2).delay_compensation


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "sqrt"}, "asynchrony_compensation"),
        ({"mode": None}, "mode"),
        ({"workers": 0}, "workers"),
        ({"smoothing": 0.0}, "smoothing"),
        ({"dc_lambda": float("nan")}, "dc_lambda"),
        ({"dc_smoothing": 2.0}, "dc_smoothing"),
    ],
)
def test_bad_settings_raise_naming_them(kwargs, message):
    arguments = {"mode": "auto", "workers": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        AsynchronyCompensator(**arguments)


def test_check_mode_accepts_none_and_names_the_setting():
    check_compensation_mode(None)
    with pytest.raises(ValueError, match="asynchrony_compensation must be one of"):
        check_compensation_mode("on")


def test_only_a_learning_rate_that_is_not_a_float_is_left_unchanged():
    params = [torch.nn.Parameter(torch.zeros(2))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for optimizer in (torch.optim.SGD(params, lr=0.1), torch.optim.AdamW(params), torch.optim.RMSprop(params)):
            assert unsupported_reason(optimizer) is None
        reason = unsupported_reason(torch.optim.SGD(params, lr=torch.tensor(0.1)))
        assert reason == "SGD has no plain float 'lr': its hyper-parameters are left unchanged"


@pytest.mark.parametrize("optimizer", [torch.optim.Adam, torch.optim.AdamW])
@pytest.mark.parametrize("mode", ["auto", "dc"])
def test_adaptive_optimizers_keep_their_betas_and_take_the_square_root_learning_rate(optimizer, mode):
    adam = optimizer([torch.nn.Parameter(torch.zeros(2))], lr=0.01, betas=(0.9, 0.99))
    compensator = Compensation(mode, lambda: (4, 8), lambda: adam).new()
    for staleness in (3, 7, 7):  # whatever the staleness: the rule depends on the training workers only
        group = {"lr": 0.01, "betas": (0.9, 0.99)}
        compensator.observe(staleness)
        compensator.apply([group])
        assert group == {"lr": pytest.approx(0.005), "betas": (0.9, 0.99)}
    assert compensator.delay_compensation == (mode == "dc")
    assert (compensator.momentum_effective, compensator.lr_effective) == (0.9, pytest.approx(0.005))


def test_momentum_of_reads_momentum_or_beta1():
    assert momentum_of({"momentum": 0.5}) == 0.5
    assert momentum_of({"betas": (0.7, 0.99)}) == 0.7
    assert momentum_of({"lr": 1.0}) is None
