"""The C API of an exported model: a header ``<name>.h`` and the unit that implements it.

An exported library holds the model's kernels and ``ember_run`` (``ember.driver.entry``), whose
caller must know the memory plan: the weights blob, a workspace of the right size, 64-byte
aligned outputs, no fallback callbacks.  This unit is that caller, written once in C so that a
program with no Python can use the model through a handle::

    #include "tinynet.h"
    tinynet_model *model;
    if (tinynet_create("tinynet.weights", &model) != EMBER_OK) {
        fprintf(stderr, "%s\\n", tinynet_last_error());
        return 1;
    }
    const void *inputs[1] = {image};          /* tinynet_input_nbytes(0) bytes */
    void *outputs[1] = {logits};              /* tinynet_output_nbytes(0) bytes */
    int status = tinynet_run(model, inputs, outputs);
    tinynet_destroy(model);

Every function of a model carries its name as prefix, so programs may link several models.
Status codes are ``EMBER_OK`` (0) or one of the ``EMBER_ERROR_*`` codes; ``<name>_last_error()``
gives the calling thread's message for its last failure (it names the argument, the file, or
the step of the model that failed).  Ownership: the caller owns every input and output buffer
(outputs of ``<name>_output_nbytes(i)`` bytes each, any alignment; inputs aligned to their
element size; no input may overlap an output); the handle owns its copy of the weights and its
workspace, freed by ``<name>_destroy``.  One handle runs one call at a time; several handles
may run at once (the library's thread pool then runs the later calls on their own threads).

The weights file (``<name>.weights``) is the blob ``ember_run`` reads, after a 64-byte header:
the magic ``EMBERWTS``, the format version and the blob's size (little-endian), and the blob's
SHA-256.  ``<name>_create`` checks each against the values compiled into the library
(a weights file of another model, another build, a truncated or modified copy is refused by
name: the kernels were compiled knowing the constants, so weights that are not the ones the
library was built with could make them read out of bounds), and
``<name>_create_from_memory`` takes the same bytes from a buffer (WebAssembly hosts, weights
embedded by the application).  The header's ``<NAME>_API_VERSION`` is passed by its inline
``create`` functions, so a program compiled against another version of the header is refused
at load rather than misreading the library.

No text from the model reaches the source unescaped: input and output names become string
literals through :func:`c_string_literal` (every byte outside a small safe set as an octal
escape) and the prefix is a sanitized identifier.
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass

import numpy as np

from ember.core.dtypes import DType
from ember.core.errors import EmberError
from ember.core.traced import Guard, SizeExpr

API_VERSION = 1
WEIGHTS_MAGIC = b"EMBERWTS"
WEIGHTS_FORMAT_VERSION = 1
WEIGHTS_HEADER_BYTES = 64
# Outputs, weights and workspace are what the kernels assume aligned to this many bytes.
KERNEL_ALIGNMENT = 64

# Status codes (also in the header).
STATUS_CODES = {
    "EMBER_OK": 0,
    "EMBER_ERROR_ARGUMENT": 1,   # a NULL, out-of-range, misaligned or overlapping argument
    "EMBER_ERROR_IO": 2,         # the weights file cannot be opened or read
    "EMBER_ERROR_WEIGHTS": 3,    # the weights are not this model's (magic, size, SHA-256)
    "EMBER_ERROR_MEMORY": 4,     # an allocation failed
    "EMBER_ERROR_VERSION": 5,    # the header's API version is not the library's
    "EMBER_ERROR_RUN": 6,        # a step of the model failed (e.g. an index out of range)
    "EMBER_ERROR_CPU": 7,        # this CPU lacks the instruction set the library was built for
}

_PREFIX = re.compile(r"[a-z][a-z0-9_]{0,47}\Z")
_RESERVED_PREFIXES = ("ember", "em")


class ExportError(EmberError, ValueError):
    """A model that cannot be exported as asked (a name, a fallback op, a dynamic shape)."""


def c_prefix(name: str) -> str:
    """``name`` as the prefix of the model's C functions: lowercase letters, digits and
    underscores, starting with a letter (anything else becomes ``_``; an empty or reserved
    result is refused so that a user sees the name their functions will get)."""
    prefix = re.sub(r"[^a-z0-9_]", "_", name.lower()).strip("_")
    prefix = re.sub(r"_+", "_", prefix)
    if prefix and prefix[0].isdigit():
        prefix = "model_" + prefix
    if not _PREFIX.match(prefix) or prefix in _RESERVED_PREFIXES or \
            prefix.startswith(("ember_", "em_")):
        raise ExportError(f"cannot make a C name of the model name {name!r} (got {prefix!r}); "
                          f"give a name of letters, digits and underscores that starts with a "
                          f"letter and is not 'ember'")
    return prefix


_SAFE_STRING_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                               b"0123456789_.-:/ ")


def c_string_literal(text: str) -> str:
    """``text`` (UTF-8) as a C string literal that no text can escape from: every byte
    outside a small safe set is a three-digit octal escape (never followed by a digit it
    could absorb, since an octal escape takes at most three)."""
    out = []
    for byte in text.encode("utf-8", "surrogatepass"):
        out.append(chr(byte) if byte in _SAFE_STRING_BYTES else f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


@dataclass(frozen=True)
class TensorInfo:
    """An input or output as the C API describes it."""

    name: str
    dtype: DType
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass(frozen=True)
class DimsSpec:
    """The dims a traced build takes at run time: ``em_dims[i]`` in the C is dim ``names[i]``.

    ``guards`` are what every call's dims must satisfy (the sizes the build serves);
    ``inputs`` and ``outputs`` give each axis of each tensor as a size expression of the dims
    (``SizeExpr``, whose ``c_code`` the API unit uses); ``workspace`` the workspace bytes;
    ``covered`` the sizes of each dim around its sample that the guards admit (for the
    documentation)."""

    names: tuple[str, ...]
    samples: tuple[int, ...]
    guards: tuple[Guard, ...]
    inputs: tuple[tuple[SizeExpr, ...], ...]
    outputs: tuple[tuple[SizeExpr, ...], ...]
    workspace: SizeExpr
    covered: tuple[tuple[int, int] | None, ...]


# The largest run-time dim a traced export accepts: size expressions are int64 arithmetic, and
# products of a few dims of at most this size times a build's constants stay far from overflow.
MAX_RUNTIME_DIM = 1 << 16


@dataclass(frozen=True)
class ApiSpec:
    """What the C API of one model needs to know (``dims``: a traced build's run-time dims;
    its tensors' shapes are then the traced sample's)."""

    prefix: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    weights_size: int
    weights_sha256: bytes
    workspace_size: int
    dims: DimsSpec | None = None
    # the weights are linked into the library (``weights_unit_source``): create_embedded
    embedded: bool = False
    # the target's instruction-set flags (a named x86-64 level is checked at open)
    march: tuple[str, ...] = ()


def weights_digest(blob: np.ndarray) -> bytes:
    """The SHA-256 of a weights blob (what the header and the library record)."""
    return hashlib.sha256(np.ascontiguousarray(blob).reshape(-1).view(np.uint8)).digest()


def weights_file_bytes(blob: np.ndarray) -> bytes:
    """The ``<name>.weights`` file of a weights blob: the 64-byte header, then the blob."""
    header = struct.pack("<8sIIQ32s", WEIGHTS_MAGIC, WEIGHTS_FORMAT_VERSION, 0, blob.nbytes,
                         weights_digest(blob))
    return header.ljust(WEIGHTS_HEADER_BYTES, b"\0") + blob.tobytes()


_SAFE_PATH = re.compile(r"[A-Za-z0-9_./+-]+\Z")


def weights_unit_source(prefix: str, blob_path: str, digest: bytes) -> str:
    """A unit placing the weights blob at ``blob_path`` in the library's read-only data,
    64-byte aligned, as ``<prefix>_embedded_weights_data`` (the assembler's ``.incbin``: a
    large model's weights would make a C array initializer of hundreds of megabytes).  ELF
    targets only.  The digest in a comment makes the unit's text, hence its cache key,
    follow the blob's content."""
    if not _SAFE_PATH.match(blob_path):
        raise ExportError(f"the weights' temporary path {blob_path!r} cannot be named in "
                          f"assembly; set TMPDIR to a directory whose path is plain ASCII "
                          f"letters, digits and / . _ + -")
    symbol = f"{prefix}_embedded_weights_data"
    return (f"/* The weights of \"{prefix}\", SHA-256 {digest.hex()}. */\n"
            f"__asm__(\".section .rodata.{symbol},\\\"a\\\"\\n\"\n"
            f"        \".balign 64\\n\"\n"
            f"        \".globl {symbol}\\n\"\n"
            f"        \".hidden {symbol}\\n\"\n"
            f"        \"{symbol}:\\n\"\n"
            f"        \".incbin \\\"{blob_path}\\\"\\n\"\n"
            f"        \".previous\\n\");\n")


def header_source(spec: ApiSpec) -> str:
    """The text of ``<prefix>.h``."""
    p = spec.prefix
    upper = p.upper()
    statuses = "\n".join(f"#define {name} {code}" for name, code in STATUS_CODES.items())
    return f"""\
/* {p}.h: the C API of the model "{p}", generated by ember.

   Link with lib{p}.so (or lib{p}.a, -lm -pthread).  Every function returns EMBER_OK (0) or an
   EMBER_ERROR_* code; {p}_last_error() says why the calling thread's last call failed.
   The caller owns every input and output buffer: inputs aligned to their element size,
   outputs of {p}_output_nbytes(i) bytes (any alignment), no input overlapping an output.
   A handle owns its weights and workspace ({p}_destroy frees them) and runs one call at a
   time. */
#ifndef {upper}_H
#define {upper}_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {{
#endif

#define {upper}_API_VERSION {API_VERSION}

#ifndef EMBER_STATUS_CODES
#define EMBER_STATUS_CODES
{statuses}
#endif

#ifndef EMBER_DTYPE_CODES
#define EMBER_DTYPE_CODES
/* Element types: the codes of ONNX's TensorProto.DataType. */
#define EMBER_DTYPE_FLOAT32 1
#define EMBER_DTYPE_UINT8 2
#define EMBER_DTYPE_INT8 3
#define EMBER_DTYPE_UINT16 4
#define EMBER_DTYPE_INT16 5
#define EMBER_DTYPE_INT32 6
#define EMBER_DTYPE_INT64 7
#define EMBER_DTYPE_BOOL 9
#define EMBER_DTYPE_FLOAT16 10
#define EMBER_DTYPE_FLOAT64 11
#define EMBER_DTYPE_UINT32 12
#define EMBER_DTYPE_UINT64 13
#define EMBER_DTYPE_BFLOAT16 16
#endif

typedef struct {p}_model {p}_model;

/* The model's signature (no handle needed).  Indices run from 0; an index out of range
   gives NULL, -1 or 0. */
int {p}_num_inputs(void);
int {p}_num_outputs(void);
const char *{p}_input_name(int index);
const char *{p}_output_name(int index);
int {p}_input_index(const char *name);   /* -1 if the model has no such input */
int {p}_output_index(const char *name);
int {p}_input_dtype(int index);          /* an EMBER_DTYPE_* code */
int {p}_output_dtype(int index);
int {p}_input_rank(int index);
int {p}_output_rank(int index);
const int64_t *{p}_input_shape(int index);   /* rank values, owned by the library */
const int64_t *{p}_output_shape(int index);
size_t {p}_input_nbytes(int index);
size_t {p}_output_nbytes(int index);

/* The library's API version; the inline create functions below check it. */
int {p}_api_version(void);
/* Load the weights file written with the library (<name>.weights). */
int {p}_open(int api_version, const char *weights_path, {p}_model **model);
/* The same bytes from memory (copied: the buffer may be freed on return). */
int {p}_open_memory(int api_version, const void *weights_file, size_t size, {p}_model **model);
/* The weights linked into the library (exported with --embed-weights; EMBER_ERROR_WEIGHTS
   otherwise), used where they lie. */
int {p}_open_embedded(int api_version, {p}_model **model);
void {p}_destroy({p}_model *model);

/* inputs[i] -> outputs[j], in the orders of the indices above (of the bound sizes). */
int {p}_run({p}_model *model, const void *const *inputs, void *const *outputs);

/* Run-time dims (a model exported with dynamic dims; none otherwise).  Before a run, set
   every dim (in the order of {p}_dim_name); then the bound_ functions give this handle's
   shapes and sizes.  A dynamic axis shows as -1 in {p}_input_shape and {p}_output_shape,
   and {p}_input_nbytes and {p}_output_nbytes of such a tensor are 0. */
int {p}_num_dims(void);
const char *{p}_dim_name(int index);
int {p}_set_dims({p}_model *model, const int64_t *dims);
const int64_t *{p}_bound_input_shape(const {p}_model *model, int index);
const int64_t *{p}_bound_output_shape(const {p}_model *model, int index);
size_t {p}_bound_input_nbytes(const {p}_model *model, int index);
size_t {p}_bound_output_nbytes(const {p}_model *model, int index);

/* Threads of the kernels, the calling thread included (n <= 0: the CPUs available). */
void {p}_set_num_threads(int n);
int {p}_get_num_threads(void);

/* The message of the calling thread's last failed call ("" if none), and a code's name. */
const char *{p}_last_error(void);
const char *{p}_status_name(int status);

/* For hosts that must place buffers in the library's memory (WebAssembly). */
void *{p}_alloc(size_t size);
void {p}_free(void *pointer);

static inline int {p}_create(const char *weights_path, {p}_model **model)
{{
  return {p}_open({upper}_API_VERSION, weights_path, model);
}}

static inline int {p}_create_from_memory(const void *weights_file, size_t size,
                                          {p}_model **model)
{{
  return {p}_open_memory({upper}_API_VERSION, weights_file, size, model);
}}

static inline int {p}_create_embedded({p}_model **model)
{{
  return {p}_open_embedded({upper}_API_VERSION, model);
}}

#ifdef __cplusplus
}}
#endif

#endif /* {upper}_H */
"""


def _c_table(values: list[str], ctype: str, name: str) -> str:
    body = ", ".join(values) if values else "0"
    return f"static const {ctype} {name}[] = {{{body}}};"


def api_source(spec: ApiSpec) -> str:
    """The C unit implementing ``header_source(spec)`` on top of ``ember_run``."""
    p = spec.prefix
    dims = spec.dims
    tensors = {"input": spec.inputs, "output": spec.outputs}
    exprs = {"input": dims.inputs if dims else None, "output": dims.outputs if dims else None}
    tables, binds = [], []
    for kind, infos in tensors.items():
        tables.append(_c_table([c_string_literal(t.name) for t in infos], "char *const",
                               f"em_{kind}_names"))
        tables.append(_c_table([str(t.dtype.onnx) for t in infos], "int", f"em_{kind}_dtypes"))
        tables.append(_c_table([str(len(t.shape)) for t in infos], "int", f"em_{kind}_ranks"))
        tables.append(_c_table([str(t.dtype.itemsize) for t in infos], "int",
                               f"em_{kind}_itemsizes"))
        for i, t in enumerate(infos):
            axes = exprs[kind][i] if exprs[kind] else tuple(SizeExpr.const(d) for d in t.shape)
            static = [f"INT64_C({d})" if a.op == "const" else "INT64_C(-1)"
                      for d, a in zip(t.shape, axes)]
            tables.append(_c_table(static, "int64_t", f"em_{kind}_shape{i}"))
            for axis, expr in enumerate(axes):
                binds.append(f"  model->{kind}_shapes[{i}][{axis}] = {expr.c_code()};")
            count = " * ".join(f"(uint64_t)model->{kind}_shapes[{i}][{a}]"
                               for a in range(len(axes))) or "UINT64_C(1)"
            binds.append(f"  model->{kind}_nbytes[{i}] = {count} * "
                         f"(uint64_t)em_{kind}_itemsizes[{i}];")
        shapes = ", ".join(f"em_{kind}_shape{i}" for i in range(len(infos))) or "0"
        tables.append(f"static const int64_t *const em_{kind}_shapes[] = {{{shapes}}};")
    names = dims.names if dims else ()
    tables.append(_c_table([c_string_literal(n) for n in names], "char *const", "em_dim_names"))
    guards = dims.guards if dims else ()
    checks = "\n".join(
        f"  if (!({condition}))\n"
        f"    return em_fail(EM_ARGUMENT, \"{p}_set_dims: %s is outside the sizes this export "
        f"serves (the guard %s)\", described, {c_string_literal(text)});"
        for condition, text in ((f"({g.lhs.c_code()}) {g.op} ({g.rhs.c_code()})", str(g))
                                for g in guards))
    statuses = ", ".join(c_string_literal(name) for name in STATUS_CODES)
    n_in, n_out = len(spec.inputs), len(spec.outputs)
    max_rank = max([len(t.shape) for t in (*spec.inputs, *spec.outputs)] + [1])
    level = _x86_level(spec.march)
    return (_DIMS_HELPERS if dims else "") + _API_TEMPLATE.format(
        embedded=1 if spec.embedded else 0,
        x86_level_check=1 if level else 0, x86_level=level or "x86-64",
        p=p, api_version=API_VERSION, n_in=n_in, n_out=n_out, tables="\n".join(tables),
        n_in_slots=max(n_in, 1), n_out_slots=max(n_out, 1), max_rank=max_rank,
        n_dims=len(names), n_dim_slots=max(len(names), 1), max_dim=MAX_RUNTIME_DIM,
        guards=checks, binds="\n".join(binds),
        workspace=(dims.workspace if dims else SizeExpr.const(spec.workspace_size)).c_code(),
        weights_size=spec.weights_size,
        digest=", ".join(f"0x{b:02x}" for b in spec.weights_sha256),
        magic=c_string_literal(WEIGHTS_MAGIC.decode()),
        header_bytes=WEIGHTS_HEADER_BYTES, format_version=WEIGHTS_FORMAT_VERSION,
        align=KERNEL_ALIGNMENT, statuses=statuses, n_statuses=len(STATUS_CODES))


def _x86_level(march: tuple[str, ...]) -> str | None:
    """The x86-64 micro-architecture level a named target is built for (``x86-64-v3`` from
    ``-march=x86-64-v3``), checked when the library is opened; None for other targets and
    for ``native`` (built for the machine that compiled it)."""
    for flag in march:
        if flag in ("-march=x86-64-v2", "-march=x86-64-v3", "-march=x86-64-v4"):
            return flag[len("-march="):]
    return None


# Division helpers of the size expressions (``SizeExpr.c_code``), defined before the unit so
# that a divisor of 0 gives 0 instead of undefined behaviour (dims are checked to be >= 1
# first, but a guard may divide by a difference of them).
_DIMS_HELPERS = r"""#include <stdint.h>
static int64_t em_api_floordiv(int64_t a, int64_t b)
{
  if (b == 0)
    return 0;
  return a / b - ((a % b != 0) & ((a < 0) != (b < 0)));
}
#define EM_FLOORDIV(a, b) em_api_floordiv((a), (b))
#define EM_FLOORMOD(a, b) ((a) - EM_FLOORDIV(a, b) * (b))
"""


_API_TEMPLATE = r"""/* The C API of the model "{p}" (see {p}.h), generated by ember. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EM_API __attribute__((visibility("default")))

typedef int32_t (*ember_host_fn)(void *ctx, int32_t node_index, void **buffers);
int32_t ember_run(void *const *inputs, void *const *outputs, const uint8_t *weights,
                  uint8_t *workspace, ember_host_fn host, void *host_ctx);
void ember_set_num_threads(int n);
int ember_get_num_threads(void);

enum {{ EM_OK = 0, EM_ARGUMENT = 1, EM_IO = 2, EM_WEIGHTS = 3, EM_MEMORY = 4, EM_VERSION = 5,
       EM_RUN = 6, EM_CPU = 7 }};

#define EM_NUM_INPUTS {n_in}
#define EM_NUM_OUTPUTS {n_out}
#define EM_NUM_DIMS {n_dims}
#define EM_MAX_RANK {max_rank}
#define EM_WEIGHTS_SIZE UINT64_C({weights_size})
static const uint8_t em_weights_sha256[32] = {{{digest}}};
#define EM_HEADER_BYTES {header_bytes}
#define EM_ALIGN {align}
#define EM_EMBEDDED {embedded}
#if EM_EMBEDDED
extern const uint8_t {p}_embedded_weights_data[];
#endif

{tables}

static const char *const em_status_names[{n_statuses}] = {{{statuses}}};

typedef struct {p}_model {p}_model;
struct {p}_model {{
  uint8_t *weights;
  int owns_weights;                 /* 0: the embedded weights, used where they lie */
  uint8_t *workspace;
  uint64_t workspace_bytes;
  int dims_set;                     /* 1 once the dims are bound (always, without dims) */
  int64_t dims[{n_dim_slots}];
  int64_t input_shapes[{n_in_slots}][EM_MAX_RANK];
  int64_t output_shapes[{n_out_slots}][EM_MAX_RANK];
  uint64_t input_nbytes[{n_in_slots}];
  uint64_t output_nbytes[{n_out_slots}];
  uint8_t *scratch[{n_out_slots}];  /* aligned stand-ins for misaligned caller outputs */
  uint64_t scratch_bytes[{n_out_slots}];
}};

/* ---- errors: the calling thread's last message ---- */
static _Thread_local char em_message[512];

static int em_fail(int status, const char *format, ...)
{{
  va_list args;
  va_start(args, format);
  vsnprintf(em_message, sizeof em_message, format, args);
  va_end(args);
  return status;
}}

EM_API const char *{p}_last_error(void) {{ return em_message; }}

EM_API const char *{p}_status_name(int status)
{{
  if (status < 0 || status >= {n_statuses})
    return "EMBER_ERROR_UNKNOWN";
  return em_status_names[status];
}}

/* ---- the signature ---- */
EM_API int {p}_num_inputs(void) {{ return EM_NUM_INPUTS; }}
EM_API int {p}_num_outputs(void) {{ return EM_NUM_OUTPUTS; }}
EM_API int {p}_api_version(void) {{ return {api_version}; }}

#define EM_GETTER(kind, count, what, type, table, missing) \
  EM_API type {p}_##kind##_##what(int index) \
  {{ return index >= 0 && index < count ? (type)table[index] : (type)(missing); }}
EM_GETTER(input, EM_NUM_INPUTS, name, const char *, em_input_names, 0)
EM_GETTER(output, EM_NUM_OUTPUTS, name, const char *, em_output_names, 0)
EM_GETTER(input, EM_NUM_INPUTS, dtype, int, em_input_dtypes, -1)
EM_GETTER(output, EM_NUM_OUTPUTS, dtype, int, em_output_dtypes, -1)
EM_GETTER(input, EM_NUM_INPUTS, rank, int, em_input_ranks, -1)
EM_GETTER(output, EM_NUM_OUTPUTS, rank, int, em_output_ranks, -1)
EM_GETTER(input, EM_NUM_INPUTS, shape, const int64_t *, em_input_shapes, 0)
EM_GETTER(output, EM_NUM_OUTPUTS, shape, const int64_t *, em_output_shapes, 0)

/* The bytes of a static shape (0 when an axis is dynamic: the bound_ functions know it). */
static size_t em_static_nbytes(const int64_t *shape, int rank, int itemsize)
{{
  size_t count = (size_t)itemsize;
  for (int d = 0; d < rank; ++d) {{
    if (shape[d] < 0)
      return 0;
    count *= (size_t)shape[d];
  }}
  return count;
}}

EM_API size_t {p}_input_nbytes(int index)
{{
  if (index < 0 || index >= EM_NUM_INPUTS)
    return 0;
  return em_static_nbytes(em_input_shapes[index], em_input_ranks[index],
                          em_input_itemsizes[index]);
}}

EM_API size_t {p}_output_nbytes(int index)
{{
  if (index < 0 || index >= EM_NUM_OUTPUTS)
    return 0;
  return em_static_nbytes(em_output_shapes[index], em_output_ranks[index],
                          em_output_itemsizes[index]);
}}

/* ---- run-time dims ---- */
EM_API int {p}_num_dims(void) {{ return EM_NUM_DIMS; }}

EM_API const char *{p}_dim_name(int index)
{{
  return index >= 0 && index < EM_NUM_DIMS ? em_dim_names[index] : 0;
}}

#define EM_BOUND(kind, count, what, type, field) \
  EM_API type {p}_bound_##kind##_##what(const {p}_model *model, int index) \
  {{ return model != NULL && model->dims_set && index >= 0 && index < count \
            ? (type)model->field[index] : (type)0; }}
EM_BOUND(input, EM_NUM_INPUTS, shape, const int64_t *, input_shapes)
EM_BOUND(output, EM_NUM_OUTPUTS, shape, const int64_t *, output_shapes)
EM_BOUND(input, EM_NUM_INPUTS, nbytes, size_t, input_nbytes)
EM_BOUND(output, EM_NUM_OUTPUTS, nbytes, size_t, output_nbytes)

static int em_index(const char *const *names, int count, const char *name)
{{
  if (name == NULL)
    return -1;
  for (int i = 0; i < count; ++i)
    if (strcmp(names[i], name) == 0)
      return i;
  return -1;
}}

EM_API int {p}_input_index(const char *name)
{{ return em_index((const char *const *)em_input_names, EM_NUM_INPUTS, name); }}
EM_API int {p}_output_index(const char *name)
{{ return em_index((const char *const *)em_output_names, EM_NUM_OUTPUTS, name); }}

/* ---- memory ---- */
static void *em_aligned(uint64_t size)
{{
  const uint64_t rounded = (size + EM_ALIGN - 1) / EM_ALIGN * EM_ALIGN;
  if (rounded > (uint64_t)SIZE_MAX)
    return NULL;
  return aligned_alloc(EM_ALIGN, rounded ? (size_t)rounded : EM_ALIGN);
}}

EM_API void *{p}_alloc(size_t size) {{ return malloc(size ? size : 1); }}
EM_API void {p}_free(void *pointer) {{ free(pointer); }}

EM_API void {p}_destroy({p}_model *model)
{{
  if (model == NULL)
    return;
  if (model->owns_weights)
    free(model->weights);
  free(model->workspace);
  for (int i = 0; i < EM_NUM_OUTPUTS; ++i)
    free(model->scratch[i]);
  free(model);
}}

/* ---- loading ---- */
static uint64_t em_le64(const uint8_t *p)
{{
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}}

static uint32_t em_le32(const uint8_t *p)
{{
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}}

/* SHA-256 (FIPS 180-4) of n bytes at p into digest. */
static const uint32_t em_sha_k[64] = {{
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2}};

static uint32_t em_rotr(uint32_t x, int n) {{ return (x >> n) | (x << (32 - n)); }}

static void em_sha256_block(uint32_t state[8], const uint8_t block[64])
{{
  uint32_t w[64];
  for (int i = 0; i < 16; ++i)
    w[i] = (uint32_t)block[4 * i] << 24 | (uint32_t)block[4 * i + 1] << 16 |
           (uint32_t)block[4 * i + 2] << 8 | (uint32_t)block[4 * i + 3];
  for (int i = 16; i < 64; ++i) {{
    const uint32_t s0 = em_rotr(w[i - 15], 7) ^ em_rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = em_rotr(w[i - 2], 17) ^ em_rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }}
  uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
  uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
  for (int i = 0; i < 64; ++i) {{
    const uint32_t t1 = h + (em_rotr(e, 6) ^ em_rotr(e, 11) ^ em_rotr(e, 25)) +
                        ((e & f) ^ (~e & g)) + em_sha_k[i] + w[i];
    const uint32_t t2 = (em_rotr(a, 2) ^ em_rotr(a, 13) ^ em_rotr(a, 22)) +
                        ((a & b) ^ (a & c) ^ (b & c));
    h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
  }}
  state[0] += a; state[1] += b; state[2] += c; state[3] += d;
  state[4] += e; state[5] += f; state[6] += g; state[7] += h;
}}

static void em_sha256(const uint8_t *p, uint64_t n, uint8_t digest[32])
{{
  uint32_t state[8] = {{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                       0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19}};
  uint64_t done = 0;
  for (; n - done >= 64; done += 64)
    em_sha256_block(state, p + done);
  uint8_t tail[128] = {{0}};
  const uint64_t rest = n - done;
  memcpy(tail, p + done, (size_t)rest);
  tail[rest] = 0x80;
  const int blocks = rest < 56 ? 1 : 2;
  const uint64_t bits = n * 8;
  for (int i = 0; i < 8; ++i)
    tail[64 * blocks - 1 - i] = (uint8_t)(bits >> (8 * i));
  for (int k = 0; k < blocks; ++k)
    em_sha256_block(state, tail + 64 * k);
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 4; ++j)
      digest[4 * i + j] = (uint8_t)(state[i] >> (24 - 8 * j));
}}

/* The header of a weights file, checked against this library; EM_OK or the error. */
static int em_check_header(const uint8_t *h, const char *source)
{{
  if (memcmp(h, {magic}, 8) != 0)
    return em_fail(EM_WEIGHTS, "%s is not an ember weights file (no EMBERWTS magic)", source);
  if (em_le32(h + 8) != {format_version})
    return em_fail(EM_WEIGHTS, "%s has weights format version %u; this library reads "
                   "version {format_version}", source, (unsigned)em_le32(h + 8));
  if (em_le64(h + 16) != EM_WEIGHTS_SIZE)
    return em_fail(EM_WEIGHTS, "%s holds %llu bytes of weights; the model \"{p}\" of this "
                   "library needs %llu: it is another model's or another build's",
                   source, (unsigned long long)em_le64(h + 16),
                   (unsigned long long)EM_WEIGHTS_SIZE);
  if (memcmp(h + 24, em_weights_sha256, 32) != 0)
    return em_fail(EM_WEIGHTS, "%s holds the weights of another build of \"{p}\" (its "
                   "SHA-256 is not this library's): use the weights exported with it", source);
  return EM_OK;
}}

/* A handle whose weights blob is allocated but not yet filled. */
/* Bind the dims em_dims (checked): every shape and size of a call at them, and a workspace
   that large. */
static int em_bind({p}_model *model, const int64_t *em_dims, const char *described)
{{
  (void)em_dims; (void)described;
{guards}
  model->dims_set = 0;  /* until every size below is bound and the workspace is large enough */
{binds}
  const int64_t workspace = {workspace};
  if (workspace < 0)
    return em_fail(EM_ARGUMENT, "{p}_set_dims: %s gives a negative workspace", described);
  if (model->workspace == NULL || (uint64_t)workspace > model->workspace_bytes) {{
    uint8_t *grown = em_aligned((uint64_t)workspace);
    if (grown == NULL)
      return em_fail(EM_MEMORY, "cannot allocate %lld bytes of workspace",
                     (long long)workspace);
    free(model->workspace);
    model->workspace = grown;
    model->workspace_bytes = (uint64_t)workspace;
  }}
  for (int d = 0; d < EM_NUM_DIMS; ++d)
    model->dims[d] = em_dims[d];
  model->dims_set = 1;
  return EM_OK;
}}

EM_API int {p}_set_dims({p}_model *model, const int64_t *dims)
{{
  if (model == NULL)
    return em_fail(EM_ARGUMENT, "{p}_set_dims: the model is NULL");
  if (EM_NUM_DIMS == 0)
    return EM_OK;
  if (dims == NULL)
    return em_fail(EM_ARGUMENT, "{p}_set_dims: the dims are NULL");
  char described[256] = "";
  size_t used = 0;
  for (int d = 0; d < EM_NUM_DIMS && used < sizeof described; ++d)
    used += (size_t)snprintf(described + used, sizeof described - used, "%s%s=%lld",
                             d ? ", " : "", em_dim_names[d], (long long)dims[d]);
  for (int d = 0; d < EM_NUM_DIMS; ++d)
    if (dims[d] < 1 || dims[d] > {max_dim})
      return em_fail(EM_ARGUMENT, "{p}_set_dims: %s: every dim must be in 1..{max_dim}",
                     described);
  return em_bind(model, dims, described);
}}

/* A handle whose weights blob is allocated but not yet filled (bound at the traced sample's
   dims, or at the static shapes). */
static int em_new_model({p}_model **out, const uint8_t *weights)
{{
  {p}_model *model = calloc(1, sizeof *model);
  if (model == NULL)
    return em_fail(EM_MEMORY, "cannot allocate the model handle");
  model->owns_weights = weights == NULL;
  model->weights = weights != NULL ? (uint8_t *)weights : em_aligned(EM_WEIGHTS_SIZE);
  if (model->weights == NULL) {{
    {p}_destroy(model);
    return em_fail(EM_MEMORY, "cannot allocate %llu bytes of weights",
                   (unsigned long long)EM_WEIGHTS_SIZE);
  }}
  if (EM_NUM_DIMS == 0) {{
    const int64_t none[1] = {{0}};
    const int status = em_bind(model, none, "");
    if (status != EM_OK) {{
      {p}_destroy(model);
      return status;
    }}
  }}
  *out = model;
  return EM_OK;
}}

/* Whether this CPU runs the x86-64 level the library was built for (checked in code that
   needs nothing beyond the baseline itself). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && {x86_level_check}
#define EM_CPU_CHECK 1
__attribute__((target("arch=x86-64"))) static int em_cpu_supported(void)
{{
  __builtin_cpu_init();
  return __builtin_cpu_supports("{x86_level}");
}}
#else
#define EM_CPU_CHECK 0
#endif

static int em_check_open(int api_version, {p}_model **model)
{{
  if (model == NULL)
    return em_fail(EM_ARGUMENT, "{p}_create: the model argument is NULL");
  *model = NULL;
  if (api_version != {api_version})
    return em_fail(EM_VERSION, "the program was compiled against version %d of {p}.h; this "
                   "library is version {api_version}: use the header exported with it",
                   api_version);
#if EM_CPU_CHECK
  if (!em_cpu_supported())
    return em_fail(EM_CPU, "this library of \"{p}\" is built for {x86_level} CPUs and this "
                   "CPU is not one: export the model for an older level (x86_64-linux, "
                   "x86_64-avx2-linux) or for this machine (host)");
#endif
  return EM_OK;
}}

static int em_verify({p}_model *model, const char *source)
{{
  uint8_t digest[32];
  em_sha256(model->weights, EM_WEIGHTS_SIZE, digest);
  if (memcmp(digest, em_weights_sha256, 32) != 0)
    return em_fail(EM_WEIGHTS, "%s: the weights do not match their SHA-256 (a damaged "
                   "or modified file)", source);
  return EM_OK;
}}

EM_API int {p}_open(int api_version, const char *path, {p}_model **out)
{{
  int status = em_check_open(api_version, out);
  if (status != EM_OK)
    return status;
  if (path == NULL)
    return em_fail(EM_ARGUMENT, "{p}_create: the weights path is NULL");
  FILE *file = fopen(path, "rb");
  if (file == NULL)
    return em_fail(EM_IO, "cannot open the weights file '%.400s'", path);
  uint8_t header[EM_HEADER_BYTES];
  if (fread(header, 1, EM_HEADER_BYTES, file) != EM_HEADER_BYTES) {{
    fclose(file);
    return em_fail(EM_WEIGHTS, "'%.400s' is shorter than a weights file's header", path);
  }}
  char source[448];
  snprintf(source, sizeof source, "the weights file '%.400s'", path);
  status = em_check_header(header, source);
  {p}_model *model = NULL;
  if (status == EM_OK)
    status = em_new_model(&model, NULL);
  if (status == EM_OK && EM_WEIGHTS_SIZE > 0 &&
      fread(model->weights, 1, (size_t)EM_WEIGHTS_SIZE, file) != (size_t)EM_WEIGHTS_SIZE)
    status = em_fail(EM_WEIGHTS, "'%.400s' ends before its %llu bytes of weights", path,
                     (unsigned long long)EM_WEIGHTS_SIZE);
  if (status == EM_OK && fgetc(file) != EOF)
    status = em_fail(EM_WEIGHTS, "'%.400s' has bytes after its weights", path);
  fclose(file);
  if (status == EM_OK)
    status = em_verify(model, source);
  if (status != EM_OK) {{
    {p}_destroy(model);
    return status;
  }}
  *out = model;
  return EM_OK;
}}

EM_API int {p}_open_memory(int api_version, const void *data, size_t size, {p}_model **out)
{{
  int status = em_check_open(api_version, out);
  if (status != EM_OK)
    return status;
  if (data == NULL)
    return em_fail(EM_ARGUMENT, "{p}_create_from_memory: the weights pointer is NULL");
  if (size < EM_HEADER_BYTES)
    return em_fail(EM_WEIGHTS, "the weights buffer (%zu bytes) is shorter than a weights "
                   "file's header", size);
  status = em_check_header(data, "the weights buffer");
  if (status != EM_OK)
    return status;
  if ((uint64_t)(size - EM_HEADER_BYTES) != EM_WEIGHTS_SIZE)
    return em_fail(EM_WEIGHTS, "the weights buffer holds %zu bytes after its header; the "
                   "model needs %llu", size - EM_HEADER_BYTES,
                   (unsigned long long)EM_WEIGHTS_SIZE);
  {p}_model *model = NULL;
  status = em_new_model(&model, NULL);
  if (status != EM_OK)
    return status;
  if (EM_WEIGHTS_SIZE > 0)
    memcpy(model->weights, (const uint8_t *)data + EM_HEADER_BYTES, (size_t)EM_WEIGHTS_SIZE);
  status = em_verify(model, "the weights buffer");
  if (status != EM_OK) {{
    {p}_destroy(model);
    return status;
  }}
  *out = model;
  return EM_OK;
}}

EM_API int {p}_open_embedded(int api_version, {p}_model **out)
{{
  int status = em_check_open(api_version, out);
  if (status != EM_OK)
    return status;
#if EM_EMBEDDED
  return em_new_model(out, {p}_embedded_weights_data);
#else
  return em_fail(EM_WEIGHTS, "this library of \"{p}\" has no embedded weights (export it "
                 "with --embed-weights, or load its .weights file with {p}_create)");
#endif
}}

/* ---- running ---- */
static int em_overlap(const void *a, uint64_t an, const void *b, uint64_t bn)
{{
  const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return an > 0 && bn > 0 && x < y + bn && y < x + an;
}}

EM_API int {p}_run({p}_model *model, const void *const *inputs, void *const *outputs)
{{
  if (model == NULL)
    return em_fail(EM_ARGUMENT, "{p}_run: the model is NULL");
  if (!model->dims_set)
    return em_fail(EM_ARGUMENT, "{p}_run: the model takes dims at run time: call "
                   "{p}_set_dims first");
  if ((inputs == NULL && EM_NUM_INPUTS > 0) || (outputs == NULL && EM_NUM_OUTPUTS > 0))
    return em_fail(EM_ARGUMENT, "{p}_run: the %s array is NULL",
                   inputs == NULL && EM_NUM_INPUTS > 0 ? "inputs" : "outputs");
  void *in_ptrs[EM_NUM_INPUTS + 1];  /* the inputs, then the dims (a traced build reads them) */
  void *out_ptrs[{n_out_slots}];
  const uint64_t *em_input_nbytes = model->input_nbytes, *em_output_nbytes = model->output_nbytes;
  for (int i = 0; i < EM_NUM_INPUTS; ++i) {{
    if (inputs[i] == NULL && em_input_nbytes[i] > 0)
      return em_fail(EM_ARGUMENT, "{p}_run: input %d ('%s') is NULL", i, em_input_names[i]);
    if ((uintptr_t)inputs[i] % (uintptr_t)em_input_itemsizes[i] != 0)
      return em_fail(EM_ARGUMENT, "{p}_run: input %d ('%s') is not aligned to its %d-byte "
                     "elements", i, em_input_names[i], em_input_itemsizes[i]);
    in_ptrs[i] = (void *)inputs[i];
  }}
  for (int j = 0; j < EM_NUM_OUTPUTS; ++j) {{
    if (outputs[j] == NULL && em_output_nbytes[j] > 0)
      return em_fail(EM_ARGUMENT, "{p}_run: output %d ('%s') is NULL", j, em_output_names[j]);
    for (int i = 0; i < EM_NUM_INPUTS; ++i)
      if (em_overlap(inputs[i], em_input_nbytes[i], outputs[j], em_output_nbytes[j]))
        return em_fail(EM_ARGUMENT, "{p}_run: output %d ('%s') overlaps input %d ('%s')", j,
                       em_output_names[j], i, em_input_names[i]);
    for (int k = 0; k < j; ++k)
      if (em_overlap(outputs[k], em_output_nbytes[k], outputs[j], em_output_nbytes[j]))
        return em_fail(EM_ARGUMENT, "{p}_run: outputs %d and %d overlap", k, j);
    out_ptrs[j] = outputs[j];
    if ((uintptr_t)outputs[j] % EM_ALIGN != 0) {{
      /* the kernels store whole aligned vectors: write an aligned copy, then the caller's */
      if (model->scratch[j] == NULL || model->scratch_bytes[j] < em_output_nbytes[j]) {{
        free(model->scratch[j]);
        model->scratch[j] = em_aligned(em_output_nbytes[j]);
        model->scratch_bytes[j] = model->scratch[j] != NULL ? em_output_nbytes[j] : 0;
      }}
      if (model->scratch[j] == NULL)
        return em_fail(EM_MEMORY, "cannot allocate %llu bytes for output %d",
                       (unsigned long long)em_output_nbytes[j], j);
      out_ptrs[j] = model->scratch[j];
    }}
  }}
  in_ptrs[EM_NUM_INPUTS] = model->dims;
  const int32_t status = ember_run(in_ptrs, out_ptrs, model->weights, model->workspace,
                                   NULL, NULL);
  if (status != 0) {{
    static const char *const reasons[] = {{"a step failed", "a fallback step had no host",
                                          "an index input was out of range",
                                          "a divisor input held 0"}};
    const int reason = status % 256;
    return em_fail(EM_RUN, "{p}_run: step %d of the model failed: %s", (int)(status / 256),
                   reason >= 0 && reason < 4 ? reasons[reason] : reasons[0]);
  }}
  for (int j = 0; j < EM_NUM_OUTPUTS; ++j)
    if (out_ptrs[j] != outputs[j])
      memcpy(outputs[j], out_ptrs[j], (size_t)em_output_nbytes[j]);
  return EM_OK;
}}

EM_API void {p}_set_num_threads(int n) {{ ember_set_num_threads(n); }}
EM_API int {p}_get_num_threads(void) {{ return ember_get_num_threads(); }}
"""
