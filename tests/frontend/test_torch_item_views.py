"""Views whose offset is a value read from a tensor (``x.narrow(0, t, n)`` with a tensor
start, ``tensor_split`` at tensor indices): AOT autograd rebuilds such an output from the
strides and storage offset of the tensor the backend returns, so ember's part must return
the view of its input, not a fresh contiguous copy (which made every such slice start at 0).

The oracle is torch eager.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from ember.torch_backend import REPORTS


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("fn", [
    lambda x, i, t: torch.tensor_split(x, i),
    lambda x, i, t: torch.tensor_split(x, i, dim=1),
    lambda x, i, t: torch.narrow(x, 1, t, 2),
    lambda x, i, t: torch.narrow(x, 0, t, 3) * 2,
])
def test_views_at_tensor_offsets_match_eager(fn) -> None:
    x = torch.arange(30.0).reshape(5, 6)
    indices, offset = torch.tensor([1, 3, 4]), torch.tensor(2)
    start = len(REPORTS)
    with torch.no_grad():
        actual = torch.compile(fn, backend="ember", fullgraph=True)(x, indices, offset)
    expected = fn(x, indices, offset)
    torch.testing.assert_close(actual, expected)
    assert not [f for r in REPORTS.since(start) for f in r.fallbacks if
                not f.op.startswith("aten._local_scalar_dense")]
