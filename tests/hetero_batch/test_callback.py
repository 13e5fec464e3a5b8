"""HeteroBatchCallback inside real Trainers: 2-rank DDP runs as subprocesses, bad input in-process."""

import csv

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from lightning_hetero import HeteroBatchCallback
from lightning_hetero.hetero_batch import HeteroBatchAdvanced
from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule, make_classification
from tests.helpers import read_json, single_device_trainer


def results(path, mode, tag=""):
    return [read_json(path / f"{mode}{tag}_rank{rank}.json") for rank in range(2)]


@pytest.mark.timing
@pytest.mark.multiprocess
def test_slowed_rank_ends_with_the_smaller_batch(run_script, tmp_path):
    """With loader worker processes (the sampler's splits reach them); the other multi-process tests here load in
    the training process."""
    args = ["--epochs", "3", "--adjust-every", "4", "--num-workers", "2"]
    run_script("hetero_train.py", str(tmp_path), "slow", *args)
    fast, slow = results(tmp_path, "slow")
    assert fast["final_split"] == slow["final_split"], "every rank applies the same decision"
    split = fast["final_split"]
    assert sum(split) == 64
    assert split[1] < split[0] and split[1] <= 20, split  # ideal for a 4x slower rank: [51, 13]
    # each rank's own measurement excludes the wait in the all-reduce: the fast rank does not look slow
    assert fast["own_throughput"] > 2.5 * slow["own_throughput"]
    # same number of steps on both ranks, and every sample used once per epoch
    assert len(fast["local_sizes"]) == len(slow["local_sizes"]) == fast["global_step"]
    assert sum(fast["local_sizes"]) + sum(slow["local_sizes"]) == 3 * 1024
    with open(tmp_path / "logs" / "slow" / "metrics.csv") as metrics:
        rows = list(csv.DictReader(metrics))
    logged = [float(r["hetero/batch_size_rank1"]) for r in rows if r.get("hetero/batch_size_rank1")]
    assert logged and logged[-1] == split[1]


@pytest.mark.timing
@pytest.mark.multiprocess
def test_asynchronous_strategy_adjusts_at_epoch_ends(run_script, tmp_path):
    """Under AsyncPSStrategy in ASP the ranks are not in lock-step: mid-epoch exchanges are skipped, epoch-end
    ones still rebalance, and every sample is still used once per epoch."""
    run_script("hetero_train.py", str(tmp_path), "slow", "--strategy", "asp", "--adjust-every", "4")
    fast, slow = results(tmp_path, "slow")
    assert fast["final_split"] == slow["final_split"]
    assert fast["final_split"][1] < fast["final_split"][0]
    assert sum(fast["local_sizes"]) + sum(slow["local_sizes"]) == 3 * 1024
    assert fast["adjustments"] <= 3, "at most one adjustment per epoch end"


@pytest.mark.timing
@pytest.mark.multiprocess
def test_defaults_rebalance_inside_the_first_epoch_then_at_epoch_ends(run_script, tmp_path):
    """With the defaults the first epoch adjusts after step 9 (2 warm-up steps, then 7 measured) as well as at its
    end, so that the next epoch starts from a split fitted on two sizes; later epochs adjust at their ends only."""
    run_script("hetero_train.py", str(tmp_path), "slow", "--epochs", "3")
    fast, slow = results(tmp_path, "slow")
    assert fast["history"] == slow["history"]
    steps = [change["step"] for change in fast["history"]]
    assert steps and steps[0] == 9, fast["history"]
    assert all(step % 16 == 0 for step in steps[1:]), fast["history"]
    sizes = list(zip(fast["local_sizes"], slow["local_sizes"], strict=True))
    assert sizes[0] == (32, 32) and sizes[16][1] < sizes[16][0], "epoch 1 starts at a rebalanced split"
    assert sum(fast["local_sizes"]) + sum(slow["local_sizes"]) == 3 * 1024


def test_a_new_tuner_adjusts_early_in_its_first_epoch_only():
    calls = []
    callback = HeteroBatchCallback(verbose=False, advanced=HeteroBatchAdvanced(warmup_steps=3))
    adjust = callback._adjust

    def recorded(trainer, epoch_end):
        calls.append((trainer.current_epoch, trainer.global_step, epoch_end))
        adjust(trainer, epoch_end)

    callback._adjust = recorded
    datamodule = SyntheticClassificationDataModule(num_samples=512, batch_size=32)  # 16 steps per epoch
    single_device_trainer(callback, max_epochs=2).fit(MLPClassifier(), datamodule=datamodule)
    assert calls == [(0, 9, False), (0, 16, True), (1, 32, True)]
    calls.clear()  # a second fit reuses the tuner, which has its costs: epoch ends only
    single_device_trainer(callback, max_epochs=1).fit(MLPClassifier(), datamodule=datamodule)
    assert calls == [(0, 16, True)]


def test_the_cadence_is_printed_once_at_the_start_of_each_fit_as_it_then_runs(monkeypatch):
    import lightning_hetero.hetero_batch.callback as module

    printed = []
    monkeypatch.setattr(module, "rank_zero_info", printed.append)
    callback = HeteroBatchCallback(verbose=False, advanced=HeteroBatchAdvanced(warmup_steps=3))
    datamodule = SyntheticClassificationDataModule(num_samples=512, batch_size=32)  # 16 steps per epoch
    single_device_trainer(callback, max_epochs=2).fit(MLPClassifier(), datamodule=datamodule)
    single_device_trainer(callback, max_epochs=1).fit(MLPClassifier(), datamodule=datamodule)  # the tuner reused
    cadence = [line for line in printed if "adjusts the split" in line]
    too_short = "epochs of 16 steps are too short to adjust every 32 steps inside them"
    assert cadence == [
        f"HeteroBatchCallback: adjusts the split at every epoch's end and after step 9 of this first epoch (to "
        f"measure its first split early); {too_short}",
        f"HeteroBatchCallback: adjusts the split at every epoch's end; {too_short}",
    ]


@pytest.mark.multiprocess
def test_mid_epoch_resume_continues_with_the_learned_split_and_weights_every_batch_by_its_real_size(
    run_script, tmp_path
):
    """1000 samples in global batches of 64 end with a 40-sample step. A mid-epoch resume replays the epoch from its
    start while Lightning's batch_idx continues, so sizes must come from the delivered batches, not batch_idx; and it
    starts with the split learnt before the checkpoint (the one decided at epoch 0's end)."""
    common = ["--samples", "1000", "--ckpt-every", "10"]
    run_script("hetero_train.py", str(tmp_path), "resume", *common, "--epochs", "3", "--max-steps", "20")
    first = results(tmp_path, "resume")
    assert first[0]["global_step"] == 20  # stopped (and checkpointed) inside epoch 1
    learned = first[0]["final_split"]
    assert learned != [32, 32]
    run_script("hetero_train.py", str(tmp_path), "resume", *common, "--epochs", "3", "--tag", "b")
    resumed = results(tmp_path, "resume", "b")
    assert [r["start_split"] for r in resumed] == [learned, learned]
    # 3 epochs of 16 steps; Lightning 2.2 counts one more step in an epoch resumed mid-way (it replays that epoch)
    assert 3 * 16 <= resumed[0]["global_step"] <= 3 * 16 + 1
    assert all(result["weight_mismatches"] == 0 for result in resumed)
    assert len(resumed[0]["local_sizes"]) == len(resumed[1]["local_sizes"]) > 0


class CountingModel(MLPClassifier):
    def __init__(self):
        super().__init__()
        self.steps = 0

    def training_step(self, batch, batch_idx):
        self.steps += 1
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_batch_size": 8, "max_batch_size": 4}, "min_batch_size .8. must not exceed max_batch_size .4."),
        ({"min_batch_size": 0}, "min_batch_size must be an integer >= 1"),
        ({"max_batch_size": -1}, "max_batch_size must be an integer >= 1"),
        ({"global_batch_size": 0}, "global_batch_size must be an integer >= 1"),
        ({"initial_batch_sizes": [4, 0]}, "initial_batch_sizes must be an integer >= 1"),
        ({"adjust_every_n_steps": 0}, "adjust_every_n_steps"),
        ({"batch_lr_scaling": "cubic"}, "batch_lr_scaling"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        HeteroBatchCallback(**kwargs)


class Stream(IterableDataset):
    def __iter__(self):
        yield from make_classification(64)


@pytest.mark.parametrize(
    ("callback_kwargs", "loader", "message"),
    [
        ({"global_batch_size": 4, "min_batch_size": 8}, None, "smaller than world_size x min_batch_size"),
        ({"global_batch_size": 1000}, None, "smaller than one global batch"),
        ({"initial_batch_sizes": [16, 16]}, None, "initial_batch_sizes has 2 entries but the world size is 1"),
        ({}, DataLoader(Stream(), batch_size=8), "cannot split an IterableDataset"),
        (
            {},
            DataLoader(make_classification(64), batch_sampler=[[0, 1], [2, 3]]),
            "batch_size, which is None",
        ),
    ],
)
def test_bad_setups_fail_before_any_training_step(callback_kwargs, loader, message):
    datamodule = None if loader is not None else SyntheticClassificationDataModule(num_samples=256, batch_size=32)
    model = CountingModel()
    trainer = single_device_trainer(HeteroBatchCallback(**callback_kwargs), num_sanity_val_steps=0)
    with pytest.raises((ValueError, TypeError), match=message):
        trainer.fit(model, train_dataloaders=loader, datamodule=datamodule)
    assert model.steps == 0


def test_gradient_accumulation_steps_once_per_window():
    model = CountingModel()
    trainer = single_device_trainer(HeteroBatchCallback(verbose=False), accumulate_grad_batches=2)
    trainer.fit(model, datamodule=SyntheticClassificationDataModule(num_samples=256, batch_size=32))
    assert model.steps == 8 and trainer.global_step == 4


@pytest.mark.parametrize("argument", ["batch_lr_scaling", "lr_scaling"])
def test_batch_lr_scaling_applies_once_for_a_larger_global_batch(argument):
    if argument == "lr_scaling":
        with pytest.deprecated_call(match=r"HeteroBatchCallback\(lr_scaling=...\) is deprecated"):
            callback = HeteroBatchCallback(global_batch_size=128, lr_scaling="linear", verbose=False)
    else:
        callback = HeteroBatchCallback(global_batch_size=128, batch_lr_scaling="linear", verbose=False)
    assert callback.batch_lr_scaling == "linear"
    model = CountingModel()
    trainer = single_device_trainer(callback)
    trainer.fit(model, datamodule=SyntheticClassificationDataModule(num_samples=512, batch_size=32))
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(4 * model.hparams.lr)
    assert callback.batch_sizes == (128,)
    assert model.steps == 4


def test_single_device_run_uses_every_sample_once():
    seen = []

    class Recording(CountingModel):
        def training_step(self, batch, batch_idx):
            seen.append(batch[0])
            return super().training_step(batch, batch_idx)

    dm = SyntheticClassificationDataModule(num_samples=100, batch_size=32, shuffle=True)
    trainer = single_device_trainer(HeteroBatchCallback(verbose=False))
    trainer.fit(Recording(), datamodule=dm)
    rows = torch.cat(seen)
    assert rows.shape[0] == 100
    assert torch.unique(rows, dim=0).shape[0] == torch.unique(dm.train_set.tensors[0], dim=0).shape[0]


@pytest.mark.timing
@pytest.mark.multiprocess
def test_cfs_throttled_rank_gets_a_stable_small_batch(run_script, tmp_path):
    """Rank 1 under an emulated CFS quota of 1/4 CPU (period 100 ms), BatchNorm buffers broadcast by DDP and a
    sync_dist log in every step. A compute window would see the throttled rank as fast whenever it waited in the
    last all-reduce (the split swung between about [52, 12] and [34, 30]); busy time at the quota's rate, with the
    collectives excluded, keeps it small, never inverted, and stable."""
    run_script("hetero_train.py", str(tmp_path), "cfs", "--epochs", "3", "--adjust-every", "4", timeout_s=240)
    fast, slow = results(tmp_path, "cfs")
    assert fast["final_split"] == slow["final_split"]
    split = fast["final_split"]
    assert split[1] < split[0] and split[1] <= 20, (split, fast["history"])
    steps = list(zip(fast["local_sizes"], slow["local_sizes"], strict=True))
    assert all(b1 <= b0 for b0, b1 in steps), "the throttled rank never gets the larger batch"
    # no swing back towards the equal split once balanced: after the first 3 adjustments rank 1 stays small
    assert all(b1 <= 20 for _, b1 in steps[3 * 4 + 1 :]), fast["history"]
    assert sum(fast["local_sizes"]) + sum(slow["local_sizes"]) == 3 * 1024


def test_strategy_collectives_are_timed_during_fit_and_restored_after():
    seen = {}

    class Probe(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen["wrapped"] = "reduce" in vars(trainer.strategy)

    hetero = HeteroBatchCallback(verbose=False)
    trainer = L.Trainer(
        max_epochs=1,
        callbacks=[hetero, Probe()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(MLPClassifier(), datamodule=SyntheticClassificationDataModule(num_samples=64, batch_size=16))
    assert seen["wrapped"]
    assert not set(vars(trainer.strategy)) & {"reduce", "all_gather", "broadcast", "barrier"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rollback_tolerance": -0.1}, "rollback_tolerance"),
        ({"rollback_tolerance": float("inf")}, "rollback_tolerance"),
        ({"change_tolerance": 0.0}, "change_tolerance"),
        ({"change_tolerance": float("nan")}, "change_tolerance"),
    ],
)
def test_new_tolerances_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        HeteroBatchCallback(advanced=HeteroBatchAdvanced(**kwargs))


def test_the_deprecated_lr_scaling_and_its_new_name_together_are_refused():
    with pytest.raises(TypeError, match="give batch_lr_scaling only"):
        HeteroBatchCallback(batch_lr_scaling="sqrt", lr_scaling="linear")


def test_attributes_moved_to_the_tuner_still_answer_with_a_deprecation_warning():
    callback = HeteroBatchCallback(verbose=False)
    with pytest.warns(DeprecationWarning, match=r"HeteroBatchCallback.policy is deprecated.*tuner.policy"):
        assert callback.policy is None  # no tuner before the train loader is built
    trainer = single_device_trainer(callback)
    trainer.fit(MLPClassifier(), datamodule=SyntheticClassificationDataModule(num_samples=128, batch_size=32))
    with pytest.warns(DeprecationWarning):
        assert callback.costs is callback.tuner.costs and callback.plan is callback.tuner.plan
    with pytest.raises(AttributeError):
        callback.no_such_attribute


# each old keyword, a value other than its default, and where that value is in effect after a fit
OLD_KEYWORDS = [
    ("deadband", 0.2, lambda callback: callback.tuner.controller.deadband),
    ("smoothing", 1.0, lambda callback: callback.meter.smoothing),
    ("warmup_steps", 1, lambda callback: callback.meter.warmup_steps),
    ("rollback_tolerance", 0.3, lambda callback: callback.tuner.policy.rollback_tolerance),
    ("change_tolerance", 0.5, lambda callback: callback.tuner.cost.change_tolerance),
    ("seed", 7, lambda callback: callback.sampler.seed),
    ("lr_scaling", "sqrt", lambda callback: callback.settings.batch_lr_scaling),
]


@pytest.mark.parametrize(("name", "value", "in_effect"), OLD_KEYWORDS, ids=[name for name, *_ in OLD_KEYWORDS])
def test_each_old_keyword_warns_and_still_takes_effect(name, value, in_effect):
    with pytest.deprecated_call(match=rf"HeteroBatchCallback\({name}=...\) is deprecated"):
        callback = HeteroBatchCallback(verbose=False, **{name: value})
    trainer = single_device_trainer(callback)
    trainer.fit(MLPClassifier(), datamodule=SyntheticClassificationDataModule(num_samples=128, batch_size=32))
    assert in_effect(callback) == value


def test_old_keywords_with_the_advanced_settings_or_unknown_ones_are_refused():
    with pytest.raises(TypeError, match="give advanced only"):
        HeteroBatchCallback(deadband=0.1, advanced=HeteroBatchAdvanced())
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_setting'"):
        HeteroBatchCallback(no_such_setting=1)


def test_settings_once_attributes_still_answer_with_a_deprecation_warning():
    callback = HeteroBatchCallback(min_batch_size=2, advanced=HeteroBatchAdvanced(deadband=0.1))
    with pytest.warns(DeprecationWarning, match=r"HeteroBatchCallback.deadband is deprecated.*settings.advanced"):
        assert callback.deadband == 0.1
    with pytest.warns(DeprecationWarning, match=r"HeteroBatchCallback.min_batch_size is deprecated.*settings"):
        assert callback.min_batch_size == 2
