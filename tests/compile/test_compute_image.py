"""Compiled Resize (ember/ops/compute/image.py) against the numpy reference.

Nearest resizing moves elements, so it must pick exactly the reference's (every coordinate
transform, every rounding mode, scales that do not divide evenly); linear and cubic
interpolation must agree within float32's tolerance.  Each test is one graph of many cases
(one C compile); the case helpers come from test_compute_elementwise.py.  Antialiased
downscaling and interpolated integer data are left to the reference (see the module).
"""

from __future__ import annotations

import numpy as np
import pytest
from compute_cases import Case
from test_compute_elementwise import check_cases, floats, integers
from test_compute_elementwise import fixed_seed  # noqa: F401  (autouse: seeds these tests too)

COORDINATE_MODES = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                    "asymmetric", "tf_half_pixel_for_nn"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


def scales(*values: float) -> np.ndarray:
    return np.array(values, np.float32)


def sizes(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def resize(x: np.ndarray, *, scale: np.ndarray | None = None, size: np.ndarray | None = None,
           roi: np.ndarray | None = None, **attrs) -> Case:
    """A Resize case whose roi/scales/sizes are constants (as exporters write them)."""
    inputs = [x, roi, scale, size]
    return Case("Resize", inputs, attrs,
                constants={i for i, v in enumerate(inputs) if i and v is not None})


def test_nearest_picks_the_reference_elements():
    x = floats((2, 3, 5, 7))
    cases = [
        # F.interpolate(scale_factor=2, mode="nearest") as both PyTorch exporters write it
        resize(x, scale=scales(1, 1, 2, 2), mode="nearest",
               coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        resize(x, size=sizes(2, 3, 3, 16), mode="nearest"),
        resize(x, size=sizes(4, 2), axes=[-1, 2], mode="nearest"),
        resize(integers((2, 5, 4), np.int32), scale=scales(1, 1.5, 0.5), mode="nearest"),
        resize(integers((3, 4), np.uint8, 0, 200) > 100, scale=scales(2, 1.25),
               mode="nearest"),
    ]
    for coordinate in COORDINATE_MODES:
        for nearest in NEAREST_MODES:  # scales that land on .5 and not
            cases.append(resize(x, scale=scales(1, 1, 1.5, 0.6), mode="nearest",
                                coordinate_transformation_mode=coordinate,
                                nearest_mode=nearest))
    check_cases(cases, tolerance=(0, 0))


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_interpolation(mode):
    x = floats((2, 3, 5, 7))
    cases = [resize(x, scale=scales(1, 1, 2, 2), mode=mode),
             resize(x, size=sizes(2, 3, 8, 3), mode=mode),  # up one axis, down the other
             resize(x, size=sizes(9), axes=[3], mode=mode, exclude_outside=1),
             resize(floats((3, 6), np.float64), scale=scales(0.5, 1.7), mode=mode)]
    for coordinate in COORDINATE_MODES[:-1]:  # tf_half_pixel_for_nn is for nearest only
        cases.append(resize(x, scale=scales(1, 1, 1.6, 0.7), mode=mode,
                            coordinate_transformation_mode=coordinate))
    if mode == "cubic":
        cases.append(resize(x, scale=scales(1, 1, 2.5, 1.5), mode=mode, cubic_coeff_a=-0.5,
                            exclude_outside=1))
    check_cases(cases, tolerance=(1e-5, 1e-6))


def test_crop_and_resize():
    """tf_crop_and_resize samples a region of the input and fills what falls outside it."""
    x = floats((1, 2, 6, 5))
    roi = np.array([0, 0, 0.2, -0.3, 1, 1, 0.9, 1.2], np.float32)
    cases = [
        resize(x, roi=roi, size=sizes(1, 2, 4, 7), mode=m, extrapolation_value=-3.5,
               coordinate_transformation_mode="tf_crop_and_resize") for m in
        ("nearest", "linear", "cubic")]
    check_cases(cases, tolerance=(1e-5, 1e-6))
