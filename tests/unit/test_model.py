"""ResNet-18 adapted to 32x32: the stem keeps the resolution, width scales, options apply."""

from __future__ import annotations

import torch
from torch import nn

from lab.run.config import ModelConfig
from lab.run.training.model import build


def test_cifar_stem_and_output():
    model = build(ModelConfig(width=8))
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, nn.Identity)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_full_width_is_resnet18_sized():
    # 11.17M parameters: torchvision's ResNet-18 minus the 7x7 stem's extra weights, with a 10-way head.
    assert sum(p.numel() for p in build(ModelConfig()).parameters()) == 11_173_962


def test_group_norm_and_float64_and_channels_last():
    model = build(ModelConfig(width=8, norm="group", dtype="float64", channels_last=True))
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert all(p.dtype == torch.float64 for p in model.parameters())
    assert model.conv1.weight.is_contiguous(memory_format=torch.channels_last)


def test_same_seed_same_initialisation():
    torch.manual_seed(0)
    a = build(ModelConfig(width=8))
    torch.manual_seed(0)
    b = build(ModelConfig(width=8))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def _modules_that_raise_when_deterministic() -> tuple[type, ...]:
    """The nn modules torch.use_deterministic_algorithms' own documentation lists as raising on CUDA (no
    deterministic kernel), read from this torch's docstring so the list follows the release."""
    import re

    doc = torch.use_deterministic_algorithms.__doc__ or ""
    throwing = doc[doc.index("operations will throw") :]
    names = re.findall(r":class:`torch\.nn\.(\w+)`", throwing)
    return tuple(getattr(nn, n) for n in names if hasattr(nn, n))


def test_no_module_lacks_a_deterministic_cuda_backward():
    # With run.deterministic=true a model holding one of these may not train on a GPU, and a CPU cannot see
    # it (CPU kernels are deterministic). Conservative: AdaptiveAvgPool2d(1) happens to lower to a mean in
    # ATen, which lab.run.training.model.GlobalAvgPool now says explicitly.
    raising = _modules_that_raise_when_deterministic()
    assert nn.AdaptiveAvgPool2d in raising  # the list was read
    for cfg in (ModelConfig(width=8), ModelConfig(width=8, norm="group")):
        culprits = [name for name, m in build(cfg).named_modules() if isinstance(m, raising)]
        assert culprits == [], f"no deterministic CUDA backward: {culprits}"


def test_global_average_pool_is_adaptive_average_pool_forward_and_backward():
    from lab.run.training.model import GlobalAvgPool

    x = torch.randn(4, 16, 4, 4, dtype=torch.float64, requires_grad=True)
    y = x.detach().clone().requires_grad_()
    ours, theirs = GlobalAvgPool()(x), nn.AdaptiveAvgPool2d(1)(y)
    assert ours.shape == theirs.shape == (4, 16, 1, 1)
    assert torch.allclose(ours, theirs, rtol=1e-12, atol=0)
    upstream = torch.randn_like(ours)
    ours.backward(upstream)
    theirs.backward(upstream)
    assert torch.allclose(x.grad, y.grad, rtol=1e-12, atol=0)
    # channels_last input (the GPU configs) gives the same numbers
    z = x.detach().contiguous(memory_format=torch.channels_last)
    assert torch.allclose(GlobalAvgPool()(z), theirs.detach(), rtol=1e-12, atol=0)


def test_zero_init_residual_starts_every_block_as_the_identity_and_is_off_by_default():
    """workshop-gpu's large-batch start (Goyal et al. 2017): each BasicBlock's last norm at zero, so a block's output
    is relu(its input) at the first step; elsewhere the norms start at one, as torchvision's default."""
    from torchvision.models.resnet import BasicBlock

    for norm in ("batch", "group"):
        zeroed = build(ModelConfig(width=8, norm=norm, zero_init_residual=True))
        plain = build(ModelConfig(width=8, norm=norm))
        blocks = [m for m in zeroed.modules() if isinstance(m, BasicBlock)]
        assert len(blocks) == 8 and all(not b.bn2.weight.detach().any() for b in blocks)
        assert all(bool((b.bn1.weight.detach() == 1).all()) for b in blocks)
        assert all(bool((b.bn2.weight.detach() == 1).all()) for b in plain.modules() if isinstance(b, BasicBlock))
        block = blocks[1].eval()  # no downsample: the identity path alone
        x = torch.randn(2, 8, 4, 4)
        with torch.no_grad():
            assert torch.equal(block(x), torch.relu(x))
