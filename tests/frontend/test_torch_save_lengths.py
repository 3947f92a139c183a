"""Saving a module that ran at several sequence lengths never drops them silently.

``ember.compile(torch_module, (x,), dynamic_shapes=...)`` serves every length (builds that
take the length at run time, or specializations), but an artifact holds code for one size of
every dim other than the batch.  Saving such a module used to write the last call's length
only; the artifact then refused every other length at load time.  Now ``save`` refuses and
lists the lengths, and ``save(path, input_shapes=...)`` writes the one asked for.  A batch that
runs in blocks is not "dropped": a batch-blocked artifact serves every batch size.  Outputs
are checked against PyTorch eager.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ember  # noqa: E402
import ember.runtime  # noqa: E402
from ember.core.errors import InputError  # noqa: E402


class _Rows(torch.nn.Module):
    """Per-position projection, then a softmax over the sequence."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        return torch.softmax(self.proj(x), dim=1)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return _Rows().eval()


def _x(batch: int, length: int) -> np.ndarray:
    return np.random.default_rng(batch * 1000 + length).standard_normal(
        (batch, length, 16)).astype(np.float32)


def _eager(model, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_several_lengths_refuse_a_save_that_would_drop_them(model, tmp_path):
    seq = torch.export.Dim("seq", min=2, max=256)
    module = ember.compile(model, (torch.from_numpy(_x(2, 8)),), dynamic_shapes=({1: seq},))
    for length in (8, 16, 40):
        _close(module(_x(2, length)), _eager(model, _x(2, length)))
    target = tmp_path / "rows.ember"
    with pytest.raises(InputError) as info:
        module.save(target)
    message = str(info.value)
    assert "ran at 3 input shapes" in message
    assert "keep only the last call's (x[2, 40, 16])" in message
    assert "x[2, 8, 16]" in message and "x[2, 16, 16]" in message
    assert "input_shapes=" in message
    assert not target.exists()
    # each length saved on request runs that length, exactly as eager does
    for length in (8, 16, 40):
        path = module.save(tmp_path / f"rows{length}.ember",
                           input_shapes={"x": (2, length, 16)})
        loaded = ember.runtime.load(path)
        _close(loaded(_x(2, length)), _eager(model, _x(2, length)))
    # and the module still runs every length after saving
    for length in (8, 16, 40):
        _close(module(_x(2, length)), _eager(model, _x(2, length)))


def test_one_length_saves_as_before(model, tmp_path):
    seq = torch.export.Dim("seq", min=2, max=256)
    module = ember.compile(model, (torch.from_numpy(_x(2, 8)),), dynamic_shapes=({1: seq},))
    _close(module(_x(2, 12)), _eager(model, _x(2, 12)))
    _close(module(_x(2, 12)), _eager(model, _x(2, 12)))
    loaded = ember.runtime.load(module.save(tmp_path / "rows.ember"))
    _close(loaded(_x(2, 12)), _eager(model, _x(2, 12)))


def test_batch_blocks_serve_every_batch_but_not_every_length(model, tmp_path):
    batch = torch.export.Dim("batch", min=1, max=64)
    seq = torch.export.Dim("seq", min=2, max=256)
    module = ember.compile(model, (torch.from_numpy(_x(2, 8)),),
                           dynamic_shapes=({0: batch, 1: seq},))
    assert module.batch_split is not None
    for size in (2, 3, 5):  # the batch varies: a batch-blocked artifact serves them all
        _close(module(_x(size, 8)), _eager(model, _x(size, 8)))
    loaded = ember.runtime.load(module.save(tmp_path / "blocks.ember"))
    for size in (1, 2, 3, 5, 7):
        _close(loaded(_x(size, 8)), _eager(model, _x(size, 8)))
    _close(module(_x(2, 24)), _eager(model, _x(2, 24)))  # a second length
    with pytest.raises(InputError, match=r"ran at 2 sizes of the dims other than the batch"):
        module.save(tmp_path / "again.ember")
    loaded = ember.runtime.load(module.save(tmp_path / "len8.ember",
                                            input_shapes={"x": (1, 8, 16)}))
    for size in (1, 4):
        _close(loaded(_x(size, 8)), _eager(model, _x(size, 8)))


def test_input_shapes_must_name_every_dynamic_input(model, tmp_path):
    seq = torch.export.Dim("seq", min=2, max=256)
    module = ember.compile(model, (torch.from_numpy(_x(2, 8)),), dynamic_shapes=({1: seq},))
    with pytest.raises(InputError, match=r"no shape for 'x'.*'y' is not an input"):
        module.save(tmp_path / "m.ember", input_shapes={"y": (2, 8, 16)})
