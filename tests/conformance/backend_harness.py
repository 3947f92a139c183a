"""Runs one case of the ONNX backend suite through ember, comparing as the suite does.

Shared by the pytest conformance tests and ``tools/conformance.py`` so both judge alike.
"""

from __future__ import annotations

import glob
import os
import traceback
import warnings

import numpy as np


def _normalize(item):
    from onnx import numpy_helper
    import onnx

    if isinstance(item, onnx.TensorProto):
        return numpy_helper.to_array(item)
    if isinstance(item, onnx.SequenceProto):
        return numpy_helper.to_list(item)
    if isinstance(item, onnx.OptionalProto):
        return numpy_helper.to_optional(item)
    return item


def _load_pb(path: str, type_proto):
    import onnx
    from onnx import numpy_helper

    data = open(path, "rb").read()
    which = type_proto.WhichOneof("value") if type_proto is not None else "tensor_type"
    if which == "sequence_type":
        proto = onnx.SequenceProto()
        proto.ParseFromString(data)
        return numpy_helper.to_list(proto)
    if which == "optional_type":
        proto = onnx.OptionalProto()
        proto.ParseFromString(data)
        return numpy_helper.to_optional(proto)
    proto = onnx.TensorProto()
    proto.ParseFromString(data)
    return numpy_helper.to_array(proto)


def data_sets(case):
    """(model, [(inputs, expected_outputs), ...]) of a suite case, whatever its kind."""
    import onnx

    if case.model is not None and case.data_sets is not None:
        return case.model, [([_normalize(i) for i in ins], [_normalize(o) for o in outs])
                            for ins, outs in case.data_sets]
    if case.model_dir is None:
        return _real_model_data(case)
    model = onnx.load(os.path.join(case.model_dir, "model.onnx"))
    sets = []
    for folder in sorted(glob.glob(os.path.join(case.model_dir, "test_data_set*"))):
        n_in = len(glob.glob(os.path.join(folder, "input_*.pb")))
        n_out = len(glob.glob(os.path.join(folder, "output_*.pb")))
        ins = [_load_pb(os.path.join(folder, f"input_{i}.pb"), model.graph.input[i].type)
               for i in range(n_in)]
        outs = [_load_pb(os.path.join(folder, f"output_{i}.pb"), model.graph.output[i].type)
                for i in range(n_out)]
        sets.append((ins, outs))
    return model, sets


def _real_model_data(case):
    """'real' (light) models: inputs as the suite makes them; expected outputs from the suite's
    stored files when present, else from onnx's ReferenceEvaluator (an oracle, test-only)."""
    import onnx
    import onnx.backend.test.runner as runner
    from onnx.backend.test.runner import Runner

    path = os.path.normpath(os.path.join(os.path.dirname(runner.__file__), "..", "..", "..", "..",
                                         case.url))
    model = onnx.load(path)
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        feeds[vi.name] = Runner.generate_dummy_data(vi, seed=0, name=case.model_name,
                                                    random=False)
    prefix = os.path.splitext(path)[0]
    stored = [f"{prefix}_output_{i}.pb" for i in range(len(model.graph.output))]
    if all(os.path.exists(p) for p in stored):
        outs = [_load_pb(p, model.graph.output[i].type) for i, p in enumerate(stored)]
    else:
        cache = os.path.join(os.environ.get("ONNX_HOME", os.path.expanduser("~/.onnx")),
                             "ember_expected", case.model_name + ".npz")
        if os.path.exists(cache):
            loaded = np.load(cache)
            outs = [loaded[f"o{i}"] for i in range(len(loaded.files))]
        else:
            from onnx.reference import ReferenceEvaluator

            outs = ReferenceEvaluator(model).run(None, feeds)
            os.makedirs(os.path.dirname(cache), exist_ok=True)
            np.savez(cache, **{f"o{i}": o for i, o in enumerate(outs)})
    return model, [(list(feeds.values()), outs)]


def compare_outputs(expected: list, actual: list, rtol: float, atol: float) -> None:
    """The suite's own comparison, applied element by element to sequence outputs.

    (``Runner.assert_similar_outputs`` recurses into a sequence as if it were a list of
    outputs, which breaks on sequences of 0-d arrays; comparing each element alone avoids it.)
    """
    from onnx.backend.test.runner import Runner

    if len(expected) != len(actual):
        raise AssertionError(f"{len(actual)} outputs, expected {len(expected)}")
    for want, got in zip(expected, actual):
        if isinstance(want, list):
            if not isinstance(got, list) or len(got) != len(want):
                raise AssertionError(f"sequence output mismatch: expected {len(want)} "
                                     f"elements, got {got!r:.200}")
            for w, g in zip(want, got):
                Runner.assert_similar_outputs([w], [g], rtol=rtol, atol=atol)
        else:
            Runner.assert_similar_outputs([want], [got], rtol=rtol, atol=atol)


def run_suite_case(case, mode: str = "reference", opt_level: int = 2) -> tuple[str, str]:
    """('pass' | 'fail' | 'error', detail) for one suite case (``opt_level``: compiled mode)."""

    import ember.onnx_backend as backend

    try:
        model, sets = data_sets(case)
    except Exception as error:
        return "error", f"cannot load the case: {type(error).__name__}: {error}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rep = backend.prepare(model, mode=mode, opt_level=opt_level)
            for inputs, expected in sets:
                outputs = rep.run(inputs)
                compare_outputs(expected, list(outputs), case.rtol, case.atol)
            if mode == "compiled":
                fallbacks = sorted({impl.node.op for impl in rep.module.build.host_nodes})
                if fallbacks:
                    return "pass", "fallback: " + ", ".join(fallbacks)
    except Exception as error:
        return _failure(error)
    return "pass", ""


def _failure(error: Exception) -> tuple[str, str]:
    """('fail', detail) for a comparison that failed, ('error', detail) for anything else."""
    if isinstance(error, AssertionError):
        return "fail", f"AssertionError: {str(error).strip()}"
    return "error", f"{type(error).__name__}: {error}\n" + "".join(
        traceback.format_exception(error)[-3:])


def run_wasm_case(case, directory: str) -> tuple[str, str]:
    """('pass' | 'fail' | 'error' | 'skip', detail) for one suite case exported for
    wasm32-wasi (``ember export``) into ``directory`` and run in wasmtime
    (``ember.runtime.wasm``).  'skip': not exportable as it stands -- inputs that are not
    tensors, or nodes that only numpy fallbacks run (which a module cannot call)."""
    import ember
    from ember.core.errors import CompileError, UnsupportedOpError
    from ember.package.c_api import ExportError
    from ember.runtime.wasm import WasmModel

    try:
        model, sets = data_sets(case)
    except Exception as error:
        return "error", f"cannot load the case: {type(error).__name__}: {error}"
    initializers = {i.name for i in model.graph.initializer}
    names = [vi.name for vi in model.graph.input if vi.name not in initializers]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for index, (inputs, expected) in enumerate(sets):
                if any(not isinstance(v, np.ndarray) for v in inputs) or \
                        any(not isinstance(v, np.ndarray) for v in expected):
                    return "skip", "inputs or outputs that are not tensors"
                feeds = dict(zip(names, inputs))
                target = os.path.join(directory, f"set{index}")
                try:
                    ember.export(model, target, target="wasm32-wasi", name="model",
                                 input_shapes={n: v.shape for n, v in feeds.items()})
                except (ExportError, UnsupportedOpError, CompileError) as error:
                    return "skip", str(error).splitlines()[0]
                outputs = WasmModel(target).run(feeds)
                compare_outputs(expected, list(outputs.values()), case.rtol, case.atol)
    except Exception as error:
        return _failure(error)
    return "pass", ""
