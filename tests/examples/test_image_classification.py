"""The image-classification example's models and data, without a Trainer."""

import importlib.util

import pytest
import torch
from examples.image_classification.data import CIFAR10DataModule, make_cifar_like
from examples.image_classification.model import (
    TORCHVISION_ARCHS,
    CifarResNet,
    ImageClassifier,
    ZeroPadShortcut,
    build_backbone,
)

HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None


def count_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize(("arch", "expected"), [("resnet20", 269_722), ("resnet32", 464_154)])
def test_cifar_resnet_parameter_counts_match_the_paper(arch, expected):
    # He et al. report 0.27M (ResNet-20) and 0.46M (ResNet-32) with parameter-free option-A shortcuts.
    assert count_parameters(build_backbone(arch, shortcut="A")) == expected
    # Option B adds two 1x1 projections with batch norm: 16->32 and 32->64 channels.
    projections = (16 * 32 + 2 * 32) + (32 * 64 + 2 * 64)
    assert count_parameters(build_backbone(arch, shortcut="B")) == expected + projections


@pytest.mark.parametrize("shortcut", ["A", "B"])
def test_cifar_resnet_stages_halve_resolution_and_double_channels(shortcut):
    model = CifarResNet(depth=20, shortcut=shortcut)
    features = model.stem(torch.randn(2, 3, 32, 32))
    shapes = []
    for block in model.stages:
        features = block(features)
        shapes.append(tuple(features.shape[1:]))
    assert shapes == [(16, 32, 32)] * 3 + [(32, 16, 16)] * 3 + [(64, 8, 8)] * 3
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_option_a_shortcut_subsamples_and_pads_with_zeros():
    x = torch.randn(2, 16, 32, 32)
    out = ZeroPadShortcut(extra_channels=16, stride=2)(x)
    assert out.shape == (2, 32, 16, 16)
    torch.testing.assert_close(out[:, :16], x[:, :, ::2, ::2])
    assert torch.count_nonzero(out[:, 16:]) == 0


@pytest.mark.parametrize("depth", [0, 18, 21])
def test_cifar_resnet_rejects_depths_not_6n_plus_2(depth):
    with pytest.raises(ValueError, match="depth must be 6n"):
        CifarResNet(depth=depth)


def test_unknown_arch_and_shortcut_are_named_in_the_error():
    with pytest.raises(ValueError, match="arch must be one of"):
        ImageClassifier(arch="resnet21")
    with pytest.raises(ValueError, match="shortcut must be"):
        ImageClassifier(shortcut="C")


@pytest.mark.parametrize("arch", TORCHVISION_ARCHS)
def test_torchvision_models_classify_cifar_sized_images(arch):
    pytest.importorskip("torchvision", reason="torchvision is not installed")
    model = ImageClassifier(arch=arch).eval()
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.skipif(HAS_TORCHVISION, reason="checks the message shown when torchvision is missing")
def test_torchvision_arch_without_torchvision_says_which_extra_to_install():
    with pytest.raises(ImportError, match=r"lightning-hetero\[vision\]"):
        build_backbone("resnet18")


def test_generated_data_is_cifar_shaped_and_seeded():
    dataset, templates = make_cifar_like(50, seed=3)
    images, labels = dataset.tensors
    assert images.shape == (50, 3, 32, 32) and images.dtype == torch.float32
    assert labels.dtype == torch.long and labels.min() >= 0 and labels.max() < 10
    assert templates.shape == (10, 3, 32, 32)
    torch.testing.assert_close(make_cifar_like(50, seed=3)[0].tensors[0], images)
    assert not torch.equal(make_cifar_like(50, seed=4)[0].tensors[0], images)


def test_generated_data_is_learnable():
    # Class means estimated on a training split classify a held-out split far above chance (10%).
    images, labels = make_cifar_like(1500, seed=0)[0].tensors
    train_x, train_y, val_x, val_y = images[:1000], labels[:1000], images[1000:], labels[1000:]
    means = torch.stack([train_x[train_y == c].mean(0) for c in range(10)]).flatten(1)
    predictions = torch.cdist(val_x.flatten(1), means).argmin(1)
    assert (predictions == val_y).float().mean() > 0.9


def test_datamodule_splits_generated_data_and_uses_the_batch_size():
    dm = CIFAR10DataModule(batch_size=16, num_samples=100, num_val_samples=40)
    dm.setup("fit")
    assert len(dm.train_set) == 100 and len(dm.val_set) == 40
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (16, 3, 32, 32) and y.shape == (16,)


def test_datamodule_never_downloads_a_missing_cifar10(tmp_path):
    with pytest.raises(FileNotFoundError, match="never downloads"):
        CIFAR10DataModule(data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="batch_size"):
        CIFAR10DataModule(batch_size=0)
