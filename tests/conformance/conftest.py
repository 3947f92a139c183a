import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("ONNX_HOME", str(Path(__file__).resolve().parents[2] / ".onnx_home"))
