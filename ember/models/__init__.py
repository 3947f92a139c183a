"""Models bundled with ember (small, for the demo and tests)."""

from pathlib import Path

MODELS_DIR = Path(__file__).parent


def default_model_path() -> Path:
    """The bundled default model: a small CNN classifier (``tinynet.onnx``)."""
    return MODELS_DIR / "tinynet.onnx"
