import numpy as np, onnx, sys, logging, time
from onnx import helper as h, TensorProto as T, numpy_helper as nh
def model(H=32):
    g = nh.from_array(np.linspace(0.5, 1.5, H).astype(np.float32), "g"); b = nh.from_array(np.linspace(-1, 1, H).astype(np.float32), "b")
    nodes = [
        h.make_node("Softmax", ["x"], ["p"], axis=1),
        h.make_node("Mul", ["p", "x"], ["r"]),
        h.make_node("LayerNormalization", ["r", "g", "b"], ["y"], axis=-1),
        h.make_node("Softmax", ["y"], ["z"], axis=-1),
        h.make_node("ReduceMean", ["x"], ["m"], axes=[1], keepdims=0),
    ]
    graph = h.make_graph(nodes, "rows", [h.make_tensor_value_info("x", T.FLOAT, ["N", "S", H])],
                         [h.make_tensor_value_info("z", T.FLOAT, ["N", "S", H]), h.make_tensor_value_info("m", T.FLOAT, ["N", H])], [g, b])
    mm = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]); mm.ir_version = 8; return mm
if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import ember, onnxruntime as ort
    m = model(); sess = ort.InferenceSession(m.SerializeToString())
    mod = ember.compile(m)
    for N, S in [(2, 5), (2, 7), (2, 12), (3, 9), (2, 1), (4, 33), (1, 64), (2, 16)]:
        x = np.random.default_rng(S).standard_normal((N, S, 32)).astype(np.float32)
        y, mm = mod(x); ry, rm = sess.run(None, {"x": x})
        print(N, S, float(abs(y - ry).max()), float(abs(mm - rm).max()), type(mod._last[1]).__name__)
    print(mod.build_reasons, "|", mod.runtime_dims_reason)
