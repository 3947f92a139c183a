"""The zoo's vision and MLP networks, written in plain torch.

torchvision does not import beside the pinned torch (see /work/shared/FACTS.md), so the
classic architectures are defined here: same layer structure, same shapes and the same
parameter counts as torchvision's ``resnet18``, ``resnet50`` and ``mobilenet_v2`` (ResNet
v1.5: the stride of a bottleneck sits on its 3x3 convolution).  Exporters see the same ops
they would see for the torchvision models, which is what matters for a compiler benchmark.

Every constructor takes the sizes as arguments so that the tests can build tiny versions
(8 base channels, 32x32 images) of exactly the same structure.
"""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """784-1024-1024-10 by default: Linear + GELU twice, a Linear head and a softmax."""

    def __init__(self, sizes: tuple[int, ...] = (784, 1024, 1024, 10)):
        super().__init__()
        layers: list[nn.Module] = []
        for index, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(fan_in, fan_out))
            if index < len(sizes) - 2:
                layers.append(nn.GELU())
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.layers(x), dim=-1)


# --------------------------------------------------------------------------- ResNet


def _conv_bn(in_channels: int, out_channels: int, kernel: int, stride: int = 1,
             groups: int = 1) -> list[nn.Module]:
    """A bias-free convolution with "same" padding followed by BatchNorm."""
    return [nn.Conv2d(in_channels, out_channels, kernel, stride, padding=(kernel - 1) // 2,
                      groups=groups, bias=False),
            nn.BatchNorm2d(out_channels)]


class BasicBlock(nn.Module):
    """ResNet-18/34 block: two 3x3 convolutions, identity or 1x1 projection shortcut."""

    expansion = 1

    def __init__(self, in_channels: int, channels: int, stride: int = 1):
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(in_channels, channels, 3, stride)
        self.relu = nn.ReLU(inplace=True)
        self.conv2, self.bn2 = _conv_bn(channels, channels, 3)
        self.downsample = _shortcut(in_channels, channels * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """ResNet-50/101/152 block (v1.5): 1x1 reduce, 3x3 (strided), 1x1 expand by 4."""

    expansion = 4

    def __init__(self, in_channels: int, channels: int, stride: int = 1):
        super().__init__()
        out_channels = channels * self.expansion
        self.conv1, self.bn1 = _conv_bn(in_channels, channels, 1)
        self.conv2, self.bn2 = _conv_bn(channels, channels, 3, stride)
        self.conv3, self.bn3 = _conv_bn(channels, out_channels, 1)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(in_channels, out_channels, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


def _shortcut(in_channels: int, out_channels: int, stride: int) -> nn.Module | None:
    """The 1x1 projection a block needs when it changes the resolution or the width."""
    if stride == 1 and in_channels == out_channels:
        return None
    return nn.Sequential(*_conv_bn(in_channels, out_channels, 1, stride))


class ResNet(nn.Module):
    """The ResNet stem, four stages and the classifier, as torchvision lays them out."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], blocks: tuple[int, ...],
                 width: int = 64, num_classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        in_channels = width
        stages = []
        for index, count in enumerate(blocks):
            channels = width * 2**index
            stride = 1 if index == 0 else 2
            stage = []
            for block_index in range(count):
                stage.append(block(in_channels, channels, stride if block_index == 0 else 1))
                in_channels = channels * block.expansion
            stages.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(width: int = 64, num_classes: int = 1000) -> ResNet:
    return ResNet(BasicBlock, (2, 2, 2, 2), width, num_classes)


def resnet50(width: int = 64, num_classes: int = 1000) -> ResNet:
    return ResNet(Bottleneck, (3, 4, 6, 3), width, num_classes)


# --------------------------------------------------------------------------- MobileNetV2


def _make_divisible(value: float, divisor: int = 8) -> int:
    """Round a scaled channel count to a multiple of ``divisor``, never below 90 % of it
    (MobileNet's rule, so that width multipliers give hardware-friendly widths)."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * value:
        rounded += divisor
    return rounded


def _conv_bn_relu6(in_channels: int, out_channels: int, kernel: int, stride: int = 1,
                   groups: int = 1) -> nn.Sequential:
    return nn.Sequential(*_conv_bn(in_channels, out_channels, kernel, stride, groups),
                         nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    """1x1 expansion (unless t = 1), 3x3 depthwise, linear 1x1 projection; a residual
    connection when the block keeps both the resolution and the width."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, expand_ratio: int):
        super().__init__()
        hidden = int(round(in_channels * expand_ratio))
        self.use_residual = stride == 1 and in_channels == out_channels
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(_conv_bn_relu6(in_channels, hidden, 1))
        layers.append(_conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden))
        layers.extend(_conv_bn(hidden, out_channels, 1))
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x)
        return x + out if self.use_residual else out


# (expansion t, output channels c, repeats n, first stride s), from the MobileNetV2 paper.
MOBILENET_V2_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                         (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


class MobileNetV2(nn.Module):
    def __init__(self, width_mult: float = 1.0, num_classes: int = 1000):
        super().__init__()
        in_channels = _make_divisible(32 * width_mult)
        last_channels = _make_divisible(1280 * max(1.0, width_mult))
        features: list[nn.Module] = [_conv_bn_relu6(3, in_channels, 3, stride=2)]
        for expand_ratio, channels, repeats, stride in MOBILENET_V2_SETTINGS:
            out_channels = _make_divisible(channels * width_mult)
            for index in range(repeats):
                features.append(InvertedResidual(in_channels, out_channels,
                                                 stride if index == 0 else 1, expand_ratio))
                in_channels = out_channels
        features.append(_conv_bn_relu6(in_channels, last_channels, 1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last_channels, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


# --------------------------------------------------------------------------- weights


def randomize_batchnorm(module: nn.Module, generator: torch.Generator) -> None:
    """Give every BatchNorm plausible trained-looking statistics and affine parameters.

    Freshly built BatchNorms hold mean 0, variance 1, scale 1 and shift 0: an identity that a
    compiler (or an exporter) may fold away and that a wrong folding would not reveal.
    """
    for layer in module.modules():
        if isinstance(layer, nn.BatchNorm2d):
            count = layer.num_features
            with torch.no_grad():
                layer.running_mean.copy_(0.1 * torch.randn(count, generator=generator))
                layer.running_var.copy_(0.5 + torch.rand(count, generator=generator))
                layer.weight.copy_(0.5 + 0.5 * torch.rand(count, generator=generator))
                layer.bias.copy_(0.1 * torch.randn(count, generator=generator))
