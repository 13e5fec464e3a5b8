"""The examples' LightningCLI entry points: a tiny fit of each in a subprocess, and every YAML config parses."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import lightning as L
import pytest
from examples.char_gpt import train as char_gpt_train
from examples.image_classification import train as image_train

import lightning_hetero

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "examples" / "configs"
QUIET_TRAINER = (
    "--trainer.logger=false",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
)
EXAMPLES: dict[str, tuple[str, Callable[..., object], tuple[str, ...]]] = {
    "resnet20": (
        "examples.image_classification.train",
        image_train.main,
        ("--data.num_samples=96", "--data.num_val_samples=32", "--data.batch_size=32"),
    ),
    "char_gpt": (
        "examples.char_gpt.train",
        char_gpt_train.main,
        (
            "--data.num_chars=4000",
            "--data.block_size=32",
            "--data.batch_size=32",
            "--model.n_layer=1",
            "--model.n_embd=32",
            "--model.n_head=2",
        ),
    ),
}
# Mode config -> the lightning_hetero names it uses; the plain-DDP base config uses none.
MODES: dict[str | None, tuple[str, ...]] = {
    None: (),
    "bsp": ("HeteroBatchCallback",),
    "asp": ("AsyncPSStrategy",),
    "hybrid": ("AsyncPSStrategy", "SyncSwitchCallback"),
}


def run_example(module: str, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """``python -m <module> <args>`` from the repository root, one thread, as a user would run it."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("MASTER_PORT", None)
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    assert proc.returncode == 0, f"{module} exited with {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def skip_unless_available(mode: str | None) -> None:
    """Skip while a feature the mode's config names has not landed in ``lightning_hetero`` yet."""
    missing = [name for name in MODES[mode] if not hasattr(lightning_hetero, name)]
    if missing:
        pytest.skip(f"lightning_hetero.{missing[0]} does not exist yet")


def config_args(example: str, mode: str | None) -> list[str]:
    """The ``--config`` arguments of an example, plus its mode's config (none for plain DDP)."""
    names = [example] if mode is None else [example, mode]
    return [f"--config={CONFIGS / f'{name}.yaml'}" for name in names]


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_fits_a_few_steps_from_its_cli(example, tmp_path):
    module, _, tiny_data = EXAMPLES[example]
    proc = run_example(
        module,
        "fit",
        *config_args(example, None),
        "--trainer.devices=1",
        "--trainer.max_steps=3",
        "--trainer.limit_val_batches=1",
        f"--trainer.default_root_dir={tmp_path}",
        *QUIET_TRAINER,
        *tiny_data,
    )
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["epoch=0-step=3.ckpt"]
    assert (tmp_path / "config.yaml").is_file()
    if example == "char_gpt":
        assert "sample after training:" in proc.stdout + proc.stderr


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("example", EXAMPLES)
def test_config_builds_its_trainer(example, mode, tmp_path, monkeypatch):
    skip_unless_available(mode)
    monkeypatch.setattr(sys, "argv", [EXAMPLES[example][0]])
    _, main, tiny_data = EXAMPLES[example]
    args = [*config_args(example, mode), f"--trainer.default_root_dir={tmp_path}", *QUIET_TRAINER, *tiny_data]
    cli = main(args, run=False)
    assert isinstance(cli.trainer, L.Trainer)
    assert cli.trainer.max_epochs > 0 and cli.trainer.num_devices == 2
    used = {type(cli.trainer.strategy).__name__, *(type(callback).__name__ for callback in cli.trainer.callbacks)}
    assert set(MODES[mode]) <= used
    if "AsyncPSStrategy" in used:
        assert cli.trainer.strategy.mode == ("asp" if mode == "asp" else "bsp")


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("example", "mode"),
    # Every mode with SGD (ResNet-20), and the hybrid once more with AdamW (the GPT), which covers ASP too. The bsp
    # config (DDP with HeteroBatchCallback) trains on two processes into its second epoch in
    # test_fabric_run_trains_an_example_on_two_processes.
    [("resnet20", "asp"), ("resnet20", "hybrid"), ("char_gpt", "hybrid")],
)
def test_example_trains_on_two_ranks(example, mode, tmp_path):
    skip_unless_available(mode)
    module, _, tiny_data = EXAMPLES[example]
    run_example(
        module,
        "fit",
        *config_args(example, mode),
        "--trainer.max_epochs=2",
        "--trainer.limit_val_batches=1",
        f"--trainer.default_root_dir={tmp_path}",
        *QUIET_TRAINER,
        *tiny_data,
        "--data.batch_size=16",
        timeout_s=180,
    )
    assert list((tmp_path / "checkpoints").glob("epoch=1-*.ckpt"))


def outside_env() -> dict[str, str]:
    """The environment of a user outside the checkout: no PYTHONPATH, no inherited rendezvous port."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for name in ("PYTHONPATH", "MASTER_PORT", "MASTER_ADDR"):
        env.pop(name, None)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("example", EXAMPLES)
def test_script_runs_by_path_from_another_directory(example, tmp_path):
    script = REPO / Path(*EXAMPLES[example][0].split(".")).with_suffix(".py")
    proc = subprocess.run(
        [sys.executable, str(script), "fit", *config_args(example, "bsp"), "--print_config"],
        cwd=tmp_path,
        env=outside_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert "HeteroBatchCallback" in proc.stdout


def test_a_copy_of_the_examples_runs_against_the_installed_package(tmp_path):
    # what a user of an installed lightning-hetero does: the examples folder copied out of the repository or sdist
    copy = tmp_path / "mine"
    shutil.copytree(REPO / "examples", copy / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    script = copy / "examples" / "image_classification" / "train.py"
    config = copy / "examples" / "configs" / "resnet20.yaml"
    proc = subprocess.run(
        [sys.executable, str(script), "fit", f"--config={config}", "--print_config"],
        cwd=tmp_path,
        env=outside_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert "arch: resnet20" in proc.stdout


@pytest.mark.multiprocess
def test_fabric_run_trains_an_example_on_two_processes(tmp_path):
    # `fabric run` (Lightning 2.x's runner) starts the script by path, through torchrun, with no PYTHONPATH
    fabric = Path(sys.executable).with_name("fabric")
    _, _, tiny_data = EXAMPLES["resnet20"]
    command = [
        str(fabric),
        "run",
        "--accelerator=cpu",
        "--devices=2",
        f"--main-port={free_port()}",
        str(REPO / "examples" / "image_classification" / "train.py"),
        "fit",
        *config_args("resnet20", "bsp"),
        "--trainer.max_steps=3",
        "--trainer.limit_val_batches=1",
        f"--trainer.default_root_dir={tmp_path}",
        *QUIET_TRAINER,
        *tiny_data,
    ]
    proc = subprocess.run(command, cwd=tmp_path, env=outside_env(), capture_output=True, text=True, timeout=180)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert "MEMBER: 2/2" in output
    # 96 samples in global batches of 64: 2 steps an epoch, so the third is in the second epoch (as a 2-epoch fit)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["epoch=1-step=3.ckpt"]
