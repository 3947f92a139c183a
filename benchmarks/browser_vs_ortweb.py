"""ember's wasm32-browser export against onnxruntime-web's wasm backend, in one headless Chromium.

    .venv/bin/python benchmarks/browser_vs_ortweb.py                      # ResNet-18, MobileNetV2
    .venv/bin/python benchmarks/browser_vs_ortweb.py --models mobilenet_v2 --calls 30
    .venv/bin/python benchmarks/browser_vs_ortweb.py --onnx model.onnx --shape 1,3,224,224

Needs Chromium (``apt-get install chromium``) and the npm package ``onnxruntime-web``: its
tarball is fetched from registry.npmjs.org once (``--ort-web-version``) and cached under
ember's cache directory; nothing is installed.  The zoo models are ``ember bench``'s
(torchscript exporter, batch 1, 224x224).

One page loads both runtimes and the same ONNX model: ember's export (``ember.export(...,
target="wasm32-browser")``, one thread) and an ``onnxruntime-web`` session on its wasm
backend with ``numThreads = 1`` (the page is not cross-origin isolated, as most are not, so
neither could use threads).  It feeds both the same input, checks that their outputs agree,
and then times them in alternating rounds (``--calls`` calls each per round, medians); the
table gives each runtime's median over rounds and ember's speed relative to
onnxruntime-web.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ember  # noqa: E402
from ember.bench.export import zoo_model_path  # noqa: E402
from ember.package.browser import find_browser, open_headless  # noqa: E402

_ORT_FILES = ("ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")

_PAGE = r"""<!doctype html>
<meta charset="utf-8">
<title>ember vs onnxruntime-web</title>
<pre id="log">running...</pre>
<script type="module">
import { load } from "./model.js";
import * as ort from "./ort/ort.wasm.min.mjs";

const CALLS = @CALLS@, ROUNDS = @ROUNDS@;
const log = document.getElementById("log");
async function report(result) {
  log.textContent = JSON.stringify(result);
  await fetch("result", { method: "POST", body: log.textContent }).catch(() => {});
}
function median(values) { const s = [...values].sort((a, b) => a - b); return s[s.length >> 1]; }

try {
  ort.env.wasm.numThreads = 1;
  ort.env.wasm.wasmPaths = new URL("./ort/", location.href).href;
  const model = await load();
  const session = await ort.InferenceSession.create("./model.onnx",
                                                    { executionProviders: ["wasm"] });
  const spec = model.inputs[0];
  const input = new Float32Array(spec.size);
  for (let k = 0; k < spec.size; k++) input[k] = ((k * 7919) % 1000 - 500) / 500;
  const feeds = { [session.inputNames[0]]: new ort.Tensor("float32", input, spec.shape) };
  const ours = model.run([input])[0];
  const theirs = (await session.run(feeds))[session.outputNames[0]].data;
  let difference = 0;
  for (let k = 0; k < ours.length; k++) {
    difference = Math.max(difference, Math.abs(ours[k] - theirs[k]));
  }
  const ember = [], ortweb = [];
  for (let round = 0; round < ROUNDS; round++) {
    const first = round % 2 === 0;
    for (const which of first ? ["ember", "ort"] : ["ort", "ember"]) {
      const times = [];
      for (let c = 0; c < CALLS; c++) {
        const t = performance.now();
        if (which === "ember") model.run([input]); else await session.run(feeds);
        times.push(performance.now() - t);
      }
      (which === "ember" ? ember : ortweb).push(median(times));
    }
  }
  await report({ ember: median(ember), ortweb: median(ortweb), difference,
                 userAgent: navigator.userAgent });
} catch (error) {
  await report({ error: String(error && error.stack || error) });
}
</script>
"""


def _ort_web(version: str) -> Path:
    """The onnxruntime-web files the page needs, fetched once into ember's cache."""
    cache = Path(os.environ.get("EMBER_CACHE_DIR") or Path.home() / ".cache" / "ember")
    directory = cache / "onnxruntime-web" / version
    if all((directory / name).is_file() for name in _ORT_FILES):
        return directory
    url = f"https://registry.npmjs.org/onnxruntime-web/-/onnxruntime-web-{version}.tgz"
    print(f"fetching {url}")
    with urllib.request.urlopen(url, timeout=300) as response:
        data = response.read()
    directory.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        for name in _ORT_FILES:
            member = archive.getmember(f"package/dist/{name}")
            extracted = archive.extractfile(member)
            if extracted is None:
                raise SystemExit(f"{url} has no dist/{name}")
            (directory / name).write_bytes(extracted.read())
    return directory


def measure(path: Path, shape: tuple[int, ...] | None, ort_web: Path, calls: int,
            rounds: int) -> dict:
    model = onnx.load(str(path))
    initializers = {i.name for i in model.graph.initializer}
    first = next(vi for vi in model.graph.input if vi.name not in initializers)
    if shape is None:
        shape = tuple(d.dim_value or 1 for d in first.type.tensor_type.shape.dim)
    site = Path(tempfile.mkdtemp(prefix="ember-ortweb-")) / "site"
    ember.export(path, site, target="wasm32-browser", input_shapes={first.name: shape},
                 name="model")
    shutil.copytree(ort_web, site / "ort")
    shutil.copyfile(path, site / "model.onnx")
    (site / "bench.html").write_text(
        _PAGE.replace("@CALLS@", str(calls)).replace("@ROUNDS@", str(rounds)), "utf-8")
    return open_headless(site, "bench.html", timeout=1800)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", default=["resnet18", "mobilenet_v2"])
    parser.add_argument("--onnx", type=Path, help="an ONNX model instead of the zoo's")
    parser.add_argument("--shape", help="its first input's shape, e.g. 1,3,224,224")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ort-web-version", default="1.30.0")
    args = parser.parse_args()
    if find_browser() is None:
        raise SystemExit("needs Chromium: apt-get install chromium")
    ort_web = _ort_web(args.ort_web_version)
    cases = [(str(args.onnx), args.onnx)] if args.onnx else \
        [(name, zoo_model_path(name)) for name in args.models]
    shape = tuple(int(d) for d in args.shape.split(",")) if args.shape else None
    print(f"onnxruntime-web {args.ort_web_version}, one thread each, headless Chromium")
    for name, path in cases:
        result = measure(path, shape, ort_web, args.calls, args.rounds)
        if "error" in result:
            print(f"{name}: failed: {result['error']}")
            continue
        print(f"{name}: ember {result['ember']:.1f} ms, onnxruntime-web {result['ortweb']:.1f} "
              f"ms -> ember is {result['ortweb'] / result['ember']:.2f}x onnxruntime-web's "
              f"speed (outputs within {result['difference']:.1e})")
    print(json.dumps({"browser": result.get("userAgent", "")}) if cases else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
