"""Element types map consistently between ember, numpy and ONNX."""

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper

from ember.core.dtypes import DType
from ember.core.errors import ModelLoadError


@pytest.mark.parametrize("dtype", list(DType))
def test_onnx_codes_agree_with_onnx_package(dtype):
    if dtype is DType.STRING:
        assert dtype.onnx == onnx.TensorProto.STRING
        return
    assert helper.tensor_dtype_to_np_dtype(dtype.onnx) == dtype.numpy
    assert DType.from_onnx(dtype.onnx) is dtype
    assert DType.from_numpy(dtype.numpy) is dtype


def test_parse_accepts_printed_and_numpy_names():
    assert DType.parse("f32") is DType.FLOAT32
    assert DType.parse("bfloat16") is DType.BFLOAT16
    assert DType.parse("int8") is DType.INT8
    assert DType.BFLOAT16.numpy == np.dtype(ml_dtypes.bfloat16)


def test_classification():
    assert DType.BFLOAT16.is_float and not DType.BFLOAT16.is_int
    assert DType.UINT8.is_int and not DType.UINT8.is_signed
    assert DType.INT4.is_signed


def test_unknown_onnx_code_is_a_clear_error():
    with pytest.raises(ModelLoadError, match="element type code 99"):
        DType.from_onnx(99)
