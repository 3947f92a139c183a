"""Batch norm in training mode through ``torch.compile(backend="ember")`` (under no_grad):
normalized by the batch's statistics, and the running statistics updated as eager does
(momentum towards the batch mean and the *unbiased* variance), every call, without a
recompile and without a fallback to PyTorch.

The oracle is a deep copy of the module run eagerly.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn

from ember.torch_backend import REPORTS


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _assert_compiled_whole(start: int) -> None:
    reports = REPORTS.since(start)
    assert reports and all(r.compiled for r in reports)
    assert not [f for r in reports for f in r.fallbacks]
    assert not [r for r in reports for r in r.recompiles], "running stats made it recompile"


@pytest.mark.parametrize("make, shape", [
    (lambda: nn.BatchNorm2d(6, momentum=0.3), (4, 6, 5, 7)),
    (lambda: nn.BatchNorm1d(5), (8, 5)),
    (lambda: nn.BatchNorm1d(5, affine=False), (3, 5, 4)),
    (lambda: nn.InstanceNorm2d(3, affine=True, track_running_stats=True), (2, 3, 4, 4)),
])
def test_running_statistics_follow_eager(make, shape) -> None:
    torch.manual_seed(0)
    model = make().train()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="ember")
    start = len(REPORTS)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(*shape) * 3 + 1
            torch.testing.assert_close(compiled(x), reference(x), rtol=1e-4, atol=1e-5)
    for name, expected in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], expected, rtol=1e-5, atol=1e-6,
                                   msg=lambda m, n=name: f"{n}: {m}")
    _assert_compiled_whole(start)


def test_block_switches_between_train_and_eval() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="ember")
    with torch.no_grad():
        for training in (True, True, False, True, False):
            model.train(training)
            reference.train(training)
            x = torch.randn(2, 3, 6, 6)
            torch.testing.assert_close(compiled(x), reference(x), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(model[1].running_var, reference[1].running_var)
    assert int(model[1].num_batches_tracked) == int(reference[1].num_batches_tracked) == 3


def test_functional_batch_norm_outputs() -> None:
    """Every output of the functional ATen op: the normalized input, the saved mean and
    1 / std of the batch, the updated running statistics (returned through the inputs)."""

    def step(x, weight, bias, mean, var):
        output, save_mean, save_rstd = torch.native_batch_norm(x, weight, bias, mean, var,
                                                               True, 0.25, 1e-3)
        return output, save_mean, save_rstd, mean, var

    for shape in ((6, 3, 5), (2, 4)):
        channels = shape[1]
        args = [torch.randn(*shape), torch.randn(channels), torch.randn(channels),
                torch.randn(channels), torch.rand(channels) + 0.5]
        expected = step(*[a.clone() for a in args])
        start = len(REPORTS)
        torch._dynamo.reset()
        with torch.no_grad():
            actual = torch.compile(step, backend="ember", fullgraph=True)(
                *[a.clone() for a in args])
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5, equal_nan=True)
        _assert_compiled_whole(start)


def test_batch_statistics_without_running_ones() -> None:
    x = torch.randn(5, 4, 3)
    expected = F.batch_norm(x, None, None, training=True, eps=1e-4)
    start = len(REPORTS)
    with torch.no_grad():
        actual = torch.compile(lambda t: F.batch_norm(t, None, None, training=True, eps=1e-4),
                               backend="ember", fullgraph=True)(x)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)
    _assert_compiled_whole(start)
