"""CIFAR ResNets written out (He et al. 2016, section 4.2), torchvision models loaded lazily, and the LightningModule.

The CIFAR layout: a 3x3 convolution to 16 channels, three stages of ``n`` basic blocks with 16, 32 and 64 channels
(the first block of stages two and three halves the resolution), global average pooling and one linear layer:
``depth = 6n + 2`` weighted layers, so ResNet-20 has ``n = 3`` and ResNet-32 ``n = 5``.

Example::

    >>> model = ImageClassifier(arch="resnet20")
    >>> model(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

from typing import Literal

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F

CIFAR_RESNET_DEPTHS = {"resnet20": 20, "resnet32": 32, "resnet44": 44, "resnet56": 56, "resnet110": 110}
TORCHVISION_ARCHS = ("resnet18", "resnet50", "vgg11", "alexnet")
# AlexNet's stride-4 stem and three max-pools leave nothing of a 32x32 image; 64x64 is the smallest size that works.
_MIN_INPUT_SIZE = {"alexnet": 64}

Shortcut = Literal["A", "B"]


class ZeroPadShortcut(nn.Module):
    """Option A: subsample by ``stride`` and append zero channels, so the shortcut has no parameters.

    Args:
        extra_channels: number of zero channels appended.
        stride: spatial subsampling factor.
    """

    def __init__(self, extra_channels: int, stride: int) -> None:
        super().__init__()
        self.extra_channels = extra_channels
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, 0, self.extra_channels))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a residual connection.

    Args:
        in_channels: input channels.
        out_channels: output channels.
        stride: stride of the first convolution (2 at the start of stages two and three).
        shortcut: ``"A"`` zero-pads the identity where the shape changes (no parameters, the paper's CIFAR choice);
            ``"B"`` projects it with a 1x1 convolution and batch norm there. Both keep the identity elsewhere.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int, shortcut: Shortcut) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        if stride == 1 and in_channels == out_channels:
            self.shortcut: nn.Module = nn.Identity()
        elif shortcut == "A":
            self.shortcut = ZeroPadShortcut(out_channels - in_channels, stride)
        else:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """He et al.'s CIFAR ResNet of depth ``6n + 2`` (20, 32, 44, 56, 110, ...).

    Args:
        depth: number of weighted layers; ``depth - 2`` must be a positive multiple of 6.
        num_classes: output classes.
        shortcut: ``"A"`` (zero-padding, parameter-free) or ``"B"`` (1x1 projection) where the shape changes.
    """

    def __init__(self, depth: int = 20, num_classes: int = 10, shortcut: Shortcut = "A") -> None:
        super().__init__()
        if depth < 8 or (depth - 2) % 6:
            raise ValueError(f"depth must be 6n + 2 for some n >= 1 (20, 32, 44, 56, 110), got {depth}")
        if shortcut not in ("A", "B"):
            raise ValueError(f"shortcut must be 'A' or 'B', got {shortcut!r}")
        blocks_per_stage = (depth - 2) // 6
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        layers: list[nn.Module] = []
        in_channels = 16
        for stage, channels in enumerate((16, 32, 64)):
            for block in range(blocks_per_stage):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(BasicBlock(in_channels, channels, stride, shortcut))
                in_channels = channels
        self.stages = nn.Sequential(*layers)
        self.fc = nn.Linear(64, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def torchvision_model(arch: str, num_classes: int) -> nn.Module:
    """A randomly initialised torchvision model, resizing small inputs where the architecture needs it.

    torchvision is imported here, not at module level: it is an optional extra (``lightning-hetero[vision]``).
    """
    if arch not in TORCHVISION_ARCHS:
        raise ValueError(f"arch must be one of {TORCHVISION_ARCHS} for torchvision, got {arch!r}")
    try:
        import torchvision
    except ImportError as err:
        raise ImportError(f"arch={arch!r} needs torchvision: pip install 'lightning-hetero[vision]'") from err
    model = getattr(torchvision.models, arch)(weights=None, num_classes=num_classes)
    if arch in _MIN_INPUT_SIZE:
        return nn.Sequential(nn.Upsample(size=_MIN_INPUT_SIZE[arch], mode="bilinear", align_corners=False), model)
    return model


def build_backbone(arch: str, num_classes: int = 10, shortcut: Shortcut = "A") -> nn.Module:
    """The network named ``arch``: a CIFAR ResNet (``resnet20``, ``resnet32``, ...) or a torchvision model.

    Example::

        >>> sum(p.numel() for p in build_backbone("resnet20").parameters())
        269722
    """
    if arch in CIFAR_RESNET_DEPTHS:
        return CifarResNet(CIFAR_RESNET_DEPTHS[arch], num_classes, shortcut)
    if arch in TORCHVISION_ARCHS:
        return torchvision_model(arch, num_classes)
    raise ValueError(f"arch must be one of {(*CIFAR_RESNET_DEPTHS, *TORCHVISION_ARCHS)}, got {arch!r}")


class ImageClassifier(L.LightningModule):
    """An image classifier trained with cross-entropy and SGD with momentum and weight decay.

    Args:
        arch: ``resnet20``, ``resnet32``, ``resnet44``, ``resnet56``, ``resnet110`` (written here), or ``resnet18``,
            ``resnet50``, ``vgg11``, ``alexnet`` (torchvision, needs the ``[vision]`` extra).
        num_classes: output classes.
        shortcut: CIFAR ResNets only: ``"A"`` (zero-padding) or ``"B"`` (projection) shortcuts.
        lr: SGD learning rate.
        momentum: SGD momentum.
        weight_decay: L2 penalty.

    Notes:
        The learning rate is constant. On the LightningCLI command line, ``--optimizer`` together with
        ``--lr_scheduler`` replaces this optimizer and adds a schedule (``--lr_scheduler`` alone is ignored).
    """

    def __init__(
        self,
        arch: str = "resnet20",
        num_classes: int = 10,
        shortcut: Shortcut = "A",
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 1e-4,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = build_backbone(arch, num_classes, shortcut)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(-1) == y).float().mean(), sync_dist=True, prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(
            self.parameters(),
            lr=self.hparams.lr,
            momentum=self.hparams.momentum,
            weight_decay=self.hparams.weight_decay,
        )
