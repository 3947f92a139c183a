"""An attention-like ONNX model with symbolic N and S."""
import numpy as np, onnx
from onnx import helper as h, TensorProto as T, numpy_helper as nh
def model(H=32):
    rng = np.random.default_rng(0)
    W = [nh.from_array(rng.standard_normal((H, H)).astype(np.float32) * 0.2, f"w{i}") for i in range(3)]
    g = nh.from_array(np.ones(H, np.float32), "g"); b = nh.from_array(np.zeros(H, np.float32), "b")
    nodes = [
        h.make_node("MatMul", ["x", "w0"], ["q"]),
        h.make_node("MatMul", ["x", "w1"], ["k"]),
        h.make_node("MatMul", ["x", "w2"], ["v"]),
        h.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        h.make_node("MatMul", ["q", "kt"], ["s"]),
        h.make_node("Softmax", ["s"], ["p"], axis=-1),
        h.make_node("MatMul", ["p", "v"], ["o"]),
        h.make_node("Add", ["o", "x"], ["r"]),
        h.make_node("LayerNormalization", ["r", "g", "b"], ["y"], axis=-1),
        h.make_node("ReduceMean", ["y"], ["m"], axes=[1], keepdims=0),
    ]
    graph = h.make_graph(nodes, "attn", [h.make_tensor_value_info("x", T.FLOAT, ["N", "S", H])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["N", "S", H]), h.make_tensor_value_info("m", T.FLOAT, ["N", H])], W + [g, b])
    mm = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]); mm.ir_version = 8; return mm
if __name__ == "__main__":
    import sys, logging, time
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import ember, onnxruntime as ort
    m = model()
    sess = ort.InferenceSession(m.SerializeToString())
    mod = ember.compile(m)
    for N, S in [(2, 5), (2, 7), (2, 12), (3, 9), (2, 1), (4, 33), (1, 64)]:
        x = np.random.default_rng(S).standard_normal((N, S, 32)).astype(np.float32)
        t = time.time(); y, mm = mod(x); dt = time.time() - t
        ry, rm = sess.run(None, {"x": x})
        print(N, S, float(abs(y - ry).max()), float(abs(mm - rm).max()), f"{dt:.2f}s", type(mod._last[1]).__name__)
    print(mod.build_reasons, mod.runtime_dims_reason)
