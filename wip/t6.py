import sys; sys.path.insert(0, "/tmp/probe")
import numpy as np
from rows import model
from ember.frontend.onnx.importer import import_onnx
from ember.driver.pipeline import BuildOptions
from ember.dynamic_dims import build_traced
from ember.package.artifact import pack_artifact
from ember.runtime.artifact import artifact_from_memory
from ember.dynamic_dims import runtime_for
g = import_onnx(model())
v = build_traced(g, BuildOptions(memory_limit=10**10), {"x": (2, 5, 32)}, {"S": 5})
p = pack_artifact(v.build); a = artifact_from_memory(p.manifest, p.files, "x")
rt = runtime_for(v, a, None)
print([s.name for s in rt.inputs], [s.name for s in rt.outputs], v.outputs)
print(v.binding({"x": (2, 5, 32)}))
x = np.random.default_rng(0).standard_normal((2, 5, 32)).astype(np.float32)
out = rt._run({"x": x})
print({k: (o.shape, float(np.abs(o).max())) for k, o in out.items()})
