"""ResNet-18 from torchvision, adapted to 32x32 inputs.

torchvision's ImageNet stem (7x7 stride-2 convolution, then max-pool) would shrink
a CIFAR image to 8x8 before the first residual block; the CIFAR variant uses a 3x3
stride-1 stem and no max-pool. `width` scales every stage (64 is the real model)
so tests can train a narrow ResNet-18 quickly.

>>> from lab.run.config import ModelConfig
>>> sum(p.numel() for p in build(ModelConfig()).parameters())
11173962
>>> sum(p.numel() for p in build(ModelConfig(width=8, norm="group")).parameters())
176402
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torchvision.models.resnet import BasicBlock, ResNet

from lab.run.config import ModelConfig
from lab.run.data.layout import NUM_CLASSES

STAGE_BLOCKS = (2, 2, 2, 2)  # ResNet-18


def group_norm(channels: int) -> nn.GroupNorm:
    # 32 groups is the GroupNorm paper's default; narrow test models have fewer channels than that.
    return nn.GroupNorm(math.gcd(32, channels), channels)


class GlobalAvgPool(nn.Module):
    """The mean over height and width, kept as N x C x 1 x 1 like `nn.AdaptiveAvgPool2d(1)`.

    AdaptiveAvgPool2d's own backward has no deterministic CUDA kernel (run.deterministic=true
    raises on it). For a 1x1 output ATen's device-independent adaptive_avg_pool2d computes a
    mean instead (grad_fn MeanBackward1 on the CPU builds of torch 2.6 and 2.14; not for XPU or
    quantized tensors), so ResNet-18 trained deterministically either way; an explicit mean
    does not depend on that shortcut, and a test can see it.

    >>> x = torch.randn(2, 4, 3, 3)
    >>> torch.allclose(GlobalAvgPool()(x), nn.AdaptiveAvgPool2d(1)(x))
    True
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3), keepdim=True)


def build(cfg: ModelConfig) -> nn.Module:
    norm_layer = nn.BatchNorm2d if cfg.norm == "batch" else group_norm
    model = ResNet(BasicBlock, list(STAGE_BLOCKS), num_classes=NUM_CLASSES, norm_layer=norm_layer)
    w = cfg.width
    # Rebuild the stem and stages at `width` with torchvision's own block builder.
    model.conv1 = nn.Conv2d(3, w, kernel_size=3, stride=1, padding=1, bias=False)
    model.bn1 = norm_layer(w)
    model.maxpool = nn.Identity()
    model.avgpool = GlobalAvgPool()
    model.inplanes = w
    model.layer1 = model._make_layer(BasicBlock, w, STAGE_BLOCKS[0])
    model.layer2 = model._make_layer(BasicBlock, 2 * w, STAGE_BLOCKS[1], stride=2)
    model.layer3 = model._make_layer(BasicBlock, 4 * w, STAGE_BLOCKS[2], stride=2)
    model.layer4 = model._make_layer(BasicBlock, 8 * w, STAGE_BLOCKS[3], stride=2)
    model.fc = nn.Linear(8 * w, NUM_CLASSES)
    _init_like_torchvision(model, cfg.zero_init_residual)
    model = model.to(dtype=getattr(torch, cfg.dtype))
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def _init_like_torchvision(model: nn.Module, zero_init_residual: bool) -> None:
    # The replaced layers were made after ResNet.__init__ ran its initialisation; repeat it for all,
    # so the result does not depend on which layers were replaced.
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.constant_(m.weight, 1)
            nn.init.constant_(m.bias, 0)
        elif isinstance(m, nn.Linear):
            bound = 1 / math.sqrt(m.in_features)
            nn.init.uniform_(m.weight, -bound, bound)
            nn.init.uniform_(m.bias, -bound, bound)
    if zero_init_residual:  # as torchvision's ResNet(zero_init_residual=True): each block's last norm
        for m in model.modules():
            if isinstance(m, BasicBlock):
                nn.init.constant_(m.bn2.weight, 0)


def signature(cfg: ModelConfig) -> dict:
    """What a checkpoint's parameters depend on: a checkpoint with another signature is refused."""
    return {"arch": cfg.arch, "width": cfg.width, "norm": cfg.norm, "dtype": cfg.dtype, "num_classes": NUM_CLASSES}
