"""ONNX backend-suite cases that ember is expected to fail, each with its reason.

Keys are exact test names (``test_<case>``, no device suffix).  The pytest suite marks them as
expected failures, so a regression shows as a failure and a fix shows as an unexpected pass;
``tools/conformance.py`` reports both too.  Keep the reasons honest and specific.
"""

from __future__ import annotations

RANDOM = "random op: the output cannot match the expected values by value"
TRAINING = "training-only op (ai.onnx.preview.training): outside an inference compiler's scope"
PREVIEW = "preview op (ai.onnx.preview): not part of a released opset"
IMAGE_DECODING = "image decoding (ImageDecoder): outside ember's scope, decode before inference"

EXPECTED_FAILURES: dict[str, str] = {
    # Dropout in training mode with ratio > 0 drops elements at random.
    "test_training_dropout": RANDOM,
    "test_training_dropout_default": RANDOM,
    "test_training_dropout_default_mask": RANDOM,
    "test_training_dropout_mask": RANDOM,
    "test_bernoulli": RANDOM,
    "test_bernoulli_double": RANDOM,
    "test_bernoulli_double_expanded": RANDOM,
    "test_bernoulli_expanded": RANDOM,
    "test_bernoulli_seed": RANDOM,
    "test_bernoulli_seed_expanded": RANDOM,
    "test_adagrad": TRAINING,
    "test_adagrad_multiple": TRAINING,
    "test_adam": TRAINING,
    "test_adam_multiple": TRAINING,
    "test_momentum": TRAINING,
    "test_momentum_multiple": TRAINING,
    "test_nesterov_momentum": TRAINING,
    "test_gradient_of_add": TRAINING,
    "test_gradient_of_add_and_mul": TRAINING,
    "test_flexattention": PREVIEW,
    "test_flexattention_causal_mask": PREVIEW,
    "test_flexattention_diff_head_sizes": PREVIEW,
    "test_flexattention_double": PREVIEW,
    "test_flexattention_fp16": PREVIEW,
    "test_flexattention_gqa": PREVIEW,
    "test_flexattention_prob_mod": PREVIEW,
    "test_flexattention_relative_positional": PREVIEW,
    "test_flexattention_scaled": PREVIEW,
    "test_flexattention_score_mod": PREVIEW,
    "test_flexattention_soft_cap": PREVIEW,
    "test_image_decoder_decode_bmp_rgb": IMAGE_DECODING,
    "test_image_decoder_decode_jpeg2k_rgb": IMAGE_DECODING,
    "test_image_decoder_decode_jpeg_bgr": IMAGE_DECODING,
    "test_image_decoder_decode_jpeg_grayscale": IMAGE_DECODING,
    "test_image_decoder_decode_jpeg_rgb": IMAGE_DECODING,
    "test_image_decoder_decode_png_rgb": IMAGE_DECODING,
    "test_image_decoder_decode_pnm_rgb": IMAGE_DECODING,
    "test_image_decoder_decode_tiff_rgb": IMAGE_DECODING,
    "test_image_decoder_decode_webp_rgb": IMAGE_DECODING,
}


# Cases that pass with the reference executor but not through the compiled path, with why.
# (Cases in EXPECTED_FAILURES are expected to fail in both modes.)
EXPECTED_COMPILED_ONLY_FAILURES: dict[str, str] = {
}


def expected_failures(mode: str) -> dict[str, str]:
    """The expected failures of a backend mode ("reference" or "compiled")."""
    if mode == "compiled":
        return {**EXPECTED_FAILURES, **EXPECTED_COMPILED_ONLY_FAILURES}
    return dict(EXPECTED_FAILURES)
