import pytest
import torch

from lightning_hetero.switching.hyperparams import PhaseHyperparamController, PhaseHyperparams


def sgd(lr=0.1, momentum=0.9):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr, momentum=momentum)


def group(opt):
    return opt.param_groups[0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lr_scale": 0}, "lr_scale"),
        ({"momentum": 1.0}, "momentum"),
        ({"momentum_ramp_steps": -1}, "momentum_ramp_steps"),
        ({"momentum_ramp_start": 1.5}, "momentum_ramp_start"),
    ],
)
def test_phase_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PhaseHyperparams(**kwargs)


def test_controller_rejects_unknown_modes_and_types():
    with pytest.raises(ValueError, match="ssp"):
        PhaseHyperparamController({"ssp": PhaseHyperparams()})
    with pytest.raises(TypeError, match="PhaseHyperparams"):
        PhaseHyperparamController({"asp": 0.5})
    with pytest.raises(ValueError, match="lr_scale"):
        PhaseHyperparamController({"asp": {"lr_scale": -1.0}})


def test_controller_accepts_mappings_as_in_yaml_configs():
    controller = PhaseHyperparamController({"asp": {"lr_scale": 0.5, "momentum_ramp_steps": 20}})
    assert controller.phases["asp"] == PhaseHyperparams(lr_scale=0.5, momentum_ramp_steps=20)


def test_lr_scale_is_relative_and_undone_when_leaving_the_phase():
    opt = sgd()
    controller = PhaseHyperparamController({"asp": PhaseHyperparams(lr_scale=0.25), "bsp": PhaseHyperparams(2.0)})
    controller.bind([opt], [])
    controller.enter("bsp", switched=False)
    assert group(opt)["lr"] == pytest.approx(0.2)
    controller.enter("asp", switched=True)
    assert group(opt)["lr"] == pytest.approx(0.025)
    controller.enter("bsp", switched=True)
    assert group(opt)["lr"] == pytest.approx(0.2)


def test_lr_scale_composes_with_a_step_schedule():
    opt = sgd(lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    controller = PhaseHyperparamController({"asp": PhaseHyperparams(lr_scale=0.5)})
    controller.bind([opt], [scheduler])
    controller.enter("bsp", switched=False)
    for _ in range(3):
        opt.step()
        scheduler.step()
    controller.enter("asp", switched=True)
    assert group(opt)["lr"] == pytest.approx(0.5 / 4)
    opt.step()
    scheduler.step()
    # The schedule goes on from where it was, at half its value.
    assert group(opt)["lr"] == pytest.approx(0.5 / 5)


def test_momentum_override_and_restore():
    opt = sgd(momentum=0.9)
    controller = PhaseHyperparamController({"asp": PhaseHyperparams(momentum=0.5)})
    controller.bind([opt], [])
    controller.enter("bsp", switched=False)
    assert group(opt)["momentum"] == 0.9
    controller.enter("asp", switched=True)
    assert group(opt)["momentum"] == 0.5
    controller.enter("bsp", switched=True)
    assert group(opt)["momentum"] == 0.9


def test_ramp_runs_only_after_a_switch_and_restores_over_n_steps():
    opt = sgd(momentum=0.8)
    phase = PhaseHyperparams(momentum_ramp_steps=4, momentum_ramp_start=0.0)
    controller = PhaseHyperparamController({"asp": phase})
    controller.bind([opt], [])
    controller.enter("asp", switched=False)
    controller.before_optimizer_step()
    assert group(opt)["momentum"] == 0.8
    controller.enter("bsp", switched=True)
    controller.enter("asp", switched=True)
    seen = []
    for _ in range(6):
        controller.before_optimizer_step()
        seen.append(group(opt)["momentum"])
    assert seen == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 0.8])
    assert not controller.ramping


def test_ramp_works_on_adam_betas():
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], betas=(0.9, 0.99))
    controller = PhaseHyperparamController({"asp": PhaseHyperparams(momentum_ramp_steps=2, momentum_ramp_start=0.5)})
    controller.bind([opt], [])
    controller.enter("bsp", switched=False)
    controller.enter("asp", switched=True)
    controller.before_optimizer_step()
    assert group(opt)["betas"] == pytest.approx((0.45, 0.99))


def test_momentum_overrides_need_a_momentum_optimizer():
    opt = torch.optim.Adagrad([torch.nn.Parameter(torch.zeros(1))])
    with pytest.raises(ValueError, match="neither 'momentum' nor 'betas'"):
        PhaseHyperparamController({"asp": PhaseHyperparams(momentum=0.5)}).bind([opt], [])
    PhaseHyperparamController({"asp": PhaseHyperparams(lr_scale=0.5)}).bind([opt], [])


def test_state_round_trip_resumes_a_running_ramp_without_rescaling():
    phases = {"asp": PhaseHyperparams(lr_scale=0.5, momentum_ramp_steps=4)}
    opt = sgd(momentum=0.8)
    controller = PhaseHyperparamController(phases)
    controller.bind([opt], [])
    controller.enter("bsp", switched=False)
    controller.enter("asp", switched=True)
    controller.before_optimizer_step()
    controller.before_optimizer_step()
    saved_opt, saved = opt.state_dict(), controller.state_dict()

    restored_opt = sgd(momentum=0.8)
    restored_opt.load_state_dict(saved_opt)
    restored = PhaseHyperparamController(phases)
    restored.load_state_dict(saved)
    restored.bind([restored_opt], [])
    assert restored.mode == "asp" and group(restored_opt)["lr"] == pytest.approx(0.05)
    restored.before_optimizer_step()
    controller.before_optimizer_step()
    assert group(restored_opt)["momentum"] == pytest.approx(group(opt)["momentum"]) == pytest.approx(0.4)


def test_the_old_name_of_lr_schedule_clock_still_works_with_a_deprecation_warning():
    import lightning_hetero.switching as switching
    from lightning_hetero.switching import hyperparams

    for module in (switching, hyperparams):
        with pytest.deprecated_call(match="StepScheduleClock is deprecated"):
            assert module.StepScheduleClock is hyperparams.LRScheduleClock
