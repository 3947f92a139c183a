"""Sorts, scatters and running products from PyTorch compiled, on both torch routes.

``torch.sort``/``argsort``/``topk`` become ember TopK nodes, ``scatter``/``scatter_add``/
``scatter_reduce`` ScatterElements, ``index_put`` ScatterND, ``cumprod`` CumProd: each now has
a compiled kernel, so the AOT route compiles such a model whole (an artifact the bare runtime
loads) and ``torch.compile`` hands them to ember instead of leaving them to PyTorch.  Oracle:
torch eager on the same inputs, with repeated scatter positions and tied values.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import ember
import ember.runtime
from ember import explain


class _Ranking(nn.Module):
    """Sorts both ways, argsort, the smallest K, a scatter of the top values into zeros, a
    scatter-add and an amax scatter_reduce with repeated positions, a running product."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(12, 40)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        exact = self.fc(x)
        h = torch.round(exact * 4) / 4  # ties, ordered by index in stable sorts
        ascending, order = torch.sort(h, dim=-1, stable=True)
        descending = torch.sort(h, dim=-1, descending=True, stable=True)[0]
        # (torch.topk orders ties as it likes: no ties here)
        smallest, where = torch.topk(exact, 5, dim=-1, largest=False)
        spread = torch.zeros_like(h).scatter(1, where, smallest)
        added = h.scatter_add(1, positions, torch.ones_like(positions, dtype=h.dtype))
        peaks = h.scatter_reduce(1, positions, h[:, :positions.shape[1]], reduce="amax")
        running = torch.cumprod(torch.sigmoid(h[:, :8]) + 0.5, dim=1)
        return ascending, order, descending, spread, added, peaks, running, \
            torch.argsort(h[:, ::2], dim=-1, stable=True)


class _Writing(nn.Module):
    """index_put with repeated rows (accumulated) and assignment into a slice of rows."""

    def forward(self, x: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        accumulated = torch.zeros(6, x.shape[1]).index_put((rows,), x, accumulate=True)
        replaced = x.clone()
        replaced[rows[:2]] = x[:2] * 10
        return accumulated, replaced


def _inputs():
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(4, 12, generator=generator)
    positions = torch.randint(0, 40, (4, 9), generator=generator)
    return x, positions


def _assert_same(got, expected) -> None:
    for g, e in zip(got, expected):
        e = e.numpy()
        assert np.asarray(g).dtype == e.dtype, (np.asarray(g).dtype, e.dtype)
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def test_aot_compiles_sorts_scatters_and_running_products_whole(tmp_path) -> None:
    model, inputs = _Ranking().eval(), _inputs()
    module = ember.compile(model, inputs)  # refuses any op left to numpy references
    assert module.build.host_nodes == []
    with torch.no_grad():
        expected = model(*inputs)
    arrays = [t.numpy() for t in inputs]
    _assert_same(module(*arrays), expected)
    bare = ember.runtime.load(module.save(tmp_path / "ranking.ember"))
    _assert_same(bare(*arrays), expected)


def test_aot_compiles_index_put_with_repeated_rows() -> None:
    model = _Writing().eval()
    x, rows = torch.randn(5, 7), torch.tensor([3, 0, 3, 5, 0])
    module = ember.compile(model, (x, rows))
    assert module.build.host_nodes == []
    _assert_same(module(x.numpy(), rows.numpy()), model(x, rows))


@pytest.mark.parametrize("model", [_Ranking, _Writing], ids=lambda m: m.__name__)
def test_torch_compile_hands_them_to_ember(model) -> None:
    module = model().eval()
    inputs = _inputs() if model is _Ranking else (torch.randn(5, 7),
                                                   torch.tensor([3, 0, 3, 5, 0]))
    result = explain(module, *inputs)
    assert not result.fallbacks, [(f.op, f.reason) for f in result.fallbacks]
    assert all(not graph.references for graph in result.graphs)
    with torch.no_grad():
        _assert_same([t.numpy() for t in result.compiled(*inputs)], module(*inputs))


class _Shifted(nn.Module):
    """A decoder's inputs shifted right by one (BART, T5, Marian): writes into slices of a
    tensor whose sizes are known only at run time."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        shifted = ids.new_zeros(ids.shape)
        shifted[:, 1:] = ids[:, :-1].clone()
        shifted[:, 0] = 2
        shifted[:, -2:-1] = 7  # bounds counted from the end
        ends = ids.clone()
        ends[:, -1:] = 4   # from the end to the end
        ends[:, :-1] = ends[:, :-1] * 2   # from the start to a bound counted from the end
        return shifted * 3 + ends


def test_slices_written_with_run_time_sizes_compile_without_a_build_per_size() -> None:
    model = _Shifted()
    sizes = [(2, 16), (3, 16), (5, 23), (2, 31)]  # one class of lengths
    result = explain(model, torch.randint(0, 100, sizes[0]))
    assert not result.fallbacks, [(f.op, f.reason) for f in result.fallbacks]
    torch._dynamo.reset()
    fast = torch.compile(model, backend="ember", dynamic=True)
    for size in sizes:
        ids = torch.randint(0, 100, size)
        assert torch.equal(fast(ids), model(ids)), size
    batch, length = torch.export.Dim("batch", max=64), torch.export.Dim("length", min=3, max=64)
    module = ember.compile(model, (torch.randint(0, 100, sizes[0]),),
                           dynamic_shapes=({0: batch, 1: length},))
    for size in sizes:
        ids = torch.randint(0, 100, size)
        np.testing.assert_array_equal(module(ids.numpy()), model(ids).numpy())
    assert len(module.build_reasons) <= 2, module.build_reasons  # the traced batch and 1
