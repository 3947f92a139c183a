"""Signal processing: Fourier transforms (DFT, STFT), window generators (Hann, Hamming,
Blackman) and MelWeightMatrix.

ONNX represents complex tensors as real ones with a trailing dimension of 2 (real, imaginary);
a real signal has a trailing dimension of 1.  Transforms use numpy's FFT in the input's
precision (single precision for float32 and narrower types, double for float64) and are cast
back to the input's dtype.
"""

from __future__ import annotations

import numpy as np

from ember.core.dims import Dim, exact_divide
from ember.core.dtypes import DType
from ember.core.errors import EmberError
from ember.ir.types import TensorType, ValueType
from ember.ops.registry import Attr, InferContext, op
from ember.ops.shape_infer import tensor_input

# ----------------------------------------------------------------------------- helpers


def _scalar(value: np.ndarray | None) -> int | None:
    """The integer held by a scalar (or one-element) input, None if absent or not constant."""
    if value is None:
        return None
    flat = np.asarray(value).reshape(-1)
    if flat.size != 1 or not isinstance(flat[0], (int, np.integer)):
        return None
    return int(flat[0])


def _constant_scalar(ctx: InferContext, index: int) -> int | None:
    return _scalar(ctx.value(index)) if ctx.has_input(index) else None


def _working_float(dtype: np.dtype) -> type:
    """Transforms run in double precision for float64 data and in single precision otherwise
    (as ONNX Runtime does and as the suite's expected values were computed)."""
    return np.float64 if dtype == np.float64 else np.float32


def _to_complex(ctx, x: np.ndarray, name: str) -> np.ndarray:
    """A (..., 1) real or (..., 2) complex ONNX signal as a numpy array without that axis."""
    if x.ndim < 1 or x.shape[-1] not in (1, 2):
        raise ctx.error(f"{name} must end with a dimension of 1 (real) or 2 (complex), "
                        f"got shape {x.shape}")
    values = x.astype(_working_float(x.dtype))
    return values[..., 0] if x.shape[-1] == 1 else values[..., 0] + 1j * values[..., 1]


def _from_complex(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Complex values as an ONNX (..., 2) real tensor of ``dtype``."""
    return np.stack([values.real, values.imag], axis=-1).astype(dtype)


def _half_spectrum(length: Dim) -> Dim:
    """floor(length / 2) + 1, the number of unique bins of a real signal's spectrum."""
    if isinstance(length, int):
        return length // 2 + 1
    half = exact_divide(length, 2) if length is not None else None
    return None if half is None else half + 1


_GENERATED_TYPES = frozenset({
    DType.UINT8, DType.UINT16, DType.UINT32, DType.UINT64, DType.INT8, DType.INT16,
    DType.INT32, DType.INT64, DType.FLOAT16, DType.FLOAT32, DType.FLOAT64, DType.BFLOAT16,
})


def _output_dtype(ctx, code: int) -> DType:
    """The element type named by an ``output_datatype`` attribute (an ONNX type code)."""
    try:
        dtype = DType.from_onnx(code)
    except EmberError:
        dtype = None
    if dtype not in _GENERATED_TYPES:
        raise ctx.error(f"output_datatype {code} is not the code of a real numeric type "
                        f"this op can produce")
    return dtype


# ----------------------------------------------------------------------------- DFT


def _dft_axis(ctx, axis: int, rank: int) -> int:
    """Normalize DFT's axis: any axis of the input but the last (real/imaginary) one."""
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise ctx.error(f"axis {axis} is out of range for an input of rank {rank}; it must lie "
                        f"in [{-rank}, -2] or [0, {rank - 2}]")
    return axis % rank


def _check_dft_mode(ctx, inverse: int, onesided: int, components: Dim) -> None:
    if onesided and not inverse and components == 2:
        raise ctx.error("a one-sided forward DFT needs a real input (last dimension 1)")
    if onesided and inverse and components == 1:
        raise ctx.error("a one-sided inverse DFT needs a complex input (last dimension 2)")


def _infer_dft(ctx: InferContext) -> list[ValueType | None]:
    x = tensor_input(ctx, 0)
    inverse, onesided = ctx.attrs["inverse"], ctx.attrs["onesided"]
    if not x.dtype.is_float:
        raise ctx.error(f"input must be a float tensor, got {x}")
    if x.shape is None:
        return [TensorType(x.dtype, None)]
    rank = len(x.shape)
    if rank < 2 or (isinstance(x.shape[-1], int) and x.shape[-1] not in (1, 2)):
        raise ctx.error(f"input must have rank >= 2 and a last dimension of 1 or 2, got {x}")
    _check_dft_mode(ctx, inverse, onesided, x.shape[-1])
    components = 1 if inverse and onesided else 2
    axis = _constant_scalar(ctx, 2) if ctx.has_input(2) else -2
    if axis is None:  # the transformed axis is unknown: so is every signal dim
        return [TensorType(x.dtype, (None,) * (rank - 1) + (components,))]
    axis = _dft_axis(ctx, axis, rank)
    length: Dim = _constant_scalar(ctx, 1)
    if not ctx.has_input(1):
        length = x.shape[axis]
        if inverse and onesided:
            length = None if length is None else 2 * (length - 1)
    shape = list(x.shape)
    shape[axis] = _half_spectrum(length) if onesided and not inverse else length
    shape[-1] = components
    return [TensorType(x.dtype, tuple(shape))]


@op("DFT", family="signal", infer=_infer_dft, attrs={
    "inverse": Attr.int(0),
    "onesided": Attr.int(0),
})
def dft(ctx, x, dft_length=None, axis=None, *, inverse, onesided):
    """Discrete Fourier transform (or its inverse) along one axis; one-sided = RFFT / IRFFT."""
    if x.ndim < 2 or x.shape[-1] not in (1, 2):
        raise ctx.error(f"input must have rank >= 2 and a last dimension of 1 or 2, got shape "
                        f"{x.shape}")
    axis = _dft_axis(ctx, -2 if axis is None else int(np.asarray(axis).reshape(-1)[0]), x.ndim)
    _check_dft_mode(ctx, inverse, onesided, x.shape[-1])
    signal = _to_complex(ctx, x, "input")
    if dft_length is not None:
        length = int(np.asarray(dft_length).reshape(-1)[0])
    elif inverse and onesided:
        length = 2 * (x.shape[axis] - 1)
    else:
        length = x.shape[axis]
    if length < 1:
        raise ctx.error(f"dft_length must be positive, got {length}")
    if inverse and onesided:
        return np.fft.irfft(signal, n=length, axis=axis)[..., None].astype(x.dtype)
    if inverse:
        return _from_complex(np.fft.ifft(signal, n=length, axis=axis), x.dtype)
    spectrum = np.fft.fft(signal, n=length, axis=axis)
    if onesided:
        spectrum = np.take(spectrum, np.arange(length // 2 + 1), axis=axis)
    return _from_complex(spectrum, x.dtype)


# ----------------------------------------------------------------------------- STFT


def _infer_stft(ctx: InferContext) -> list[ValueType | None]:
    signal = tensor_input(ctx, 0)
    if signal.shape is not None and (len(signal.shape) != 3 or (
            isinstance(signal.shape[-1], int) and signal.shape[-1] not in (1, 2))):
        raise ctx.error(f"signal must have shape (batch, length, 1 or 2), got {signal}")
    if ctx.attrs["onesided"] and signal.shape is not None and signal.shape[-1] == 2:
        raise ctx.error("a one-sided STFT needs a real signal (last dimension 1)")
    batch, length = (None, None) if signal.shape is None else signal.shape[:2]
    frame_length: Dim = _constant_scalar(ctx, 3)
    if ctx.has_input(2):
        window = tensor_input(ctx, 2)
        if window.shape is not None:
            if len(window.shape) != 1:
                raise ctx.error(f"window must be 1-D, got {window}")
            if not ctx.has_input(3):
                frame_length = window.shape[0]
    elif not ctx.has_input(3):
        frame_length = length
    step = _constant_scalar(ctx, 1)
    frames: Dim = None
    if step is not None and step < 1:
        raise ctx.error(f"frame_step must be positive, got {step}")
    if step is not None and length is not None and frame_length is not None:
        span = length - frame_length
        if isinstance(span, int):
            frames = span // step + 1
        else:
            quotient = exact_divide(span, step)
            frames = None if quotient is None else quotient + 1
    bins = _half_spectrum(frame_length) if ctx.attrs["onesided"] else frame_length
    return [TensorType(signal.dtype, (batch, frames, bins, 2))]


@op("STFT", family="signal", infer=_infer_stft, attrs={"onesided": Attr.int(1)})
def stft(ctx, signal, frame_step, window=None, frame_length=None, *, onesided):
    """Short-time Fourier transform: the DFT of windowed frames slid along the signal."""
    if signal.ndim != 3:
        raise ctx.error(f"signal must have shape (batch, length, 1 or 2), got {signal.shape}")
    if onesided and signal.shape[-1] == 2:
        raise ctx.error("a one-sided STFT needs a real signal (last dimension 1)")
    values = _to_complex(ctx, signal, "signal")  # (batch, length)
    length = values.shape[1]
    step = int(np.asarray(frame_step).reshape(-1)[0])
    if frame_length is not None:
        size = int(np.asarray(frame_length).reshape(-1)[0])
    else:
        size = window.shape[0] if window is not None else length
    if window is not None and (window.ndim != 1 or window.shape[0] != size):
        raise ctx.error(f"window must be 1-D of length frame_length={size}, got shape "
                        f"{window.shape}")
    if step < 1 or not 1 <= size <= length:
        raise ctx.error(f"need frame_step >= 1 and 1 <= frame_length <= signal length "
                        f"({length}), got frame_step={step}, frame_length={size}")
    frames = (length - size) // step + 1
    starts = np.arange(frames)[:, None] * step
    framed = values[:, starts + np.arange(size)[None, :]]  # (batch, frames, size)
    if window is not None:
        framed = framed * window.astype(framed.real.dtype)
    spectrum = np.fft.fft(framed, axis=-1)
    if onesided:
        spectrum = spectrum[..., : size // 2 + 1]
    return _from_complex(spectrum, signal.dtype)


# ----------------------------------------------------------------------------- windows


def _infer_window(ctx: InferContext) -> list[ValueType | None]:
    size = tensor_input(ctx, 0)
    if size.dtype not in (DType.INT32, DType.INT64):
        raise ctx.error(f"size must be an int32 or int64 scalar, got {size}")
    dtype = _output_dtype(ctx, ctx.attrs["output_datatype"])
    return [TensorType(dtype, (_constant_scalar(ctx, 0),))]


def _cosine_window(ctx, size: np.ndarray, periodic: int, output_datatype: int,
                   coefficients: tuple[float, ...]) -> np.ndarray:
    """sum_k (-1)^k a_k cos(2 pi k n / N), N = size if periodic else size - 1."""
    dtype = _output_dtype(ctx, output_datatype).numpy
    length = int(np.asarray(size).reshape(-1)[0])
    if length < 0:
        raise ctx.error(f"size must not be negative, got {length}")
    if length == 1:
        return np.ones(1, dtype=dtype)
    period = length if periodic else length - 1
    phase = 2 * np.pi * np.arange(length) / period
    window = sum((-1) ** k * a * np.cos(k * phase) for k, a in enumerate(coefficients))
    return np.asarray(window, dtype=np.float64).astype(dtype)


_WINDOW_ATTRS = {"output_datatype": Attr.int(1), "periodic": Attr.int(1)}


@op("HannWindow", family="signal", infer=_infer_window, attrs=_WINDOW_ATTRS)
def hann_window(ctx, size, *, output_datatype, periodic):
    """Hann window: 0.5 - 0.5 cos(2 pi n / N)."""
    return _cosine_window(ctx, size, periodic, output_datatype, (0.5, 0.5))


@op("HammingWindow", family="signal", infer=_infer_window, attrs=_WINDOW_ATTRS)
def hamming_window(ctx, size, *, output_datatype, periodic):
    """Hamming window: 25/46 - 21/46 cos(2 pi n / N)."""
    return _cosine_window(ctx, size, periodic, output_datatype, (25 / 46, 21 / 46))


@op("BlackmanWindow", family="signal", infer=_infer_window, attrs=_WINDOW_ATTRS)
def blackman_window(ctx, size, *, output_datatype, periodic):
    """Blackman window: 0.42 - 0.5 cos(2 pi n / N) + 0.08 cos(4 pi n / N)."""
    return _cosine_window(ctx, size, periodic, output_datatype, (0.42, 0.5, 0.08))


# ----------------------------------------------------------------------------- MelWeightMatrix


def _infer_mel(ctx: InferContext) -> list[ValueType | None]:
    dtype = _output_dtype(ctx, ctx.attrs["output_datatype"])
    dft_length = _constant_scalar(ctx, 1)
    bins = None if dft_length is None else dft_length // 2 + 1
    return [TensorType(dtype, (bins, _constant_scalar(ctx, 0)))]


def _hz_to_mel(hz: float) -> float:
    return 2595.0 * np.log10(1.0 + hz / 700.0)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)


@op("MelWeightMatrix", family="signal", infer=_infer_mel,
    attrs={"output_datatype": Attr.int(1)})
def mel_weight_matrix(ctx, num_mel_bins, dft_length, sample_rate, lower_edge_hertz,
                      upper_edge_hertz, *, output_datatype):
    """Triangular filters (peak 1) mapping a one-sided spectrum to num_mel_bins mel bands."""
    dtype = _output_dtype(ctx, output_datatype).numpy
    bands, length, rate = (int(np.asarray(v).reshape(-1)[0])
                           for v in (num_mel_bins, dft_length, sample_rate))
    low, high = (float(np.asarray(v).reshape(-1)[0]) for v in (lower_edge_hertz,
                                                               upper_edge_hertz))
    if bands < 1 or length < 1 or rate < 1 or not 0 <= low < high:
        raise ctx.error(f"need positive num_mel_bins, dft_length and sample_rate and "
                        f"0 <= lower_edge_hertz < upper_edge_hertz; got {bands}, {length}, "
                        f"{rate}, {low}, {high}")
    # bands + 2 points evenly spaced on the mel scale (ONNX divides the range by bands + 2),
    # mapped to spectrogram bin indices.
    mel_low, mel_high = _hz_to_mel(low), _hz_to_mel(high)
    points = mel_low + np.arange(bands + 2) * (mel_high - mel_low) / (bands + 2)
    edges = np.floor((length + 1) * _mel_to_hz(points) / rate).astype(np.int64)
    if edges[-1] > length // 2:
        raise ctx.error(f"upper_edge_hertz {high} lies above the Nyquist frequency "
                        f"{rate / 2} of sample_rate {rate}")
    weights = np.zeros((length // 2 + 1, bands))
    for band in range(bands):
        left, center, right = edges[band: band + 3]
        if center == left:
            weights[center, band] = 1.0
        else:
            rising = np.arange(left, center + 1)
            weights[rising, band] = (rising - left) / (center - left)
        if right > center:
            falling = np.arange(center, right)
            weights[falling, band] = (right - falling) / (right - center)
    return weights.astype(dtype)
