"""ONNX import: ``import_onnx(path_or_model) -> Graph``."""

from ember.frontend.onnx.importer import import_onnx, load_onnx_model

__all__ = ["import_onnx", "load_onnx_model"]
