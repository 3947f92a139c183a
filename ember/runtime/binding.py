"""The one call contract of every ember model object.

``ember.Module``, the runtime's ``CompiledModel`` and ``ember.onnx_backend``'s ``EmberRep``
take inputs the same way, through these functions:

* ``model(*arrays, **named)``: positional arrays in input order, then the rest by name; a
  single ndarray is ONE input (never iterated: iterating a stacked array would bind its rows
  to the inputs).  Returns the output array for a one-output model, else a tuple of arrays in
  output order (:func:`call_result`).
* ``model.run(feeds)``: ``feeds`` is a mapping name -> array, or a list/tuple of arrays in
  input order (a bare ndarray is one input).  Returns a dict output name -> array.
* ``out=`` (both forms, keyword only): arrays the outputs are written into instead of new
  ones, given as the inputs are -- a list/tuple in output order (None where a new array will
  do), a dict output name -> array, or one array for a one-output model
  (:func:`bind_outputs`); each must be a writable, C-contiguous array of the output's exact
  dtype and shape (:func:`check_output`).  The call returns those same arrays.

Missing, unknown, surplus and doubly given (positionally and by name) inputs are
:class:`InputError` exceptions that name them.  Values must be numpy arrays; a numpy scalar
(``np.float32(1)``) is a 0-d array; anything else is an InputError naming the input and what it
should be.  Binding does not check dtypes and shapes: the caller does, against its own types.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ember.runtime.errors import InputError


def bind_call(names: Sequence[str], args: Sequence[Any],
              kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Inputs of ``model(*args, **kwargs)`` by name (values unchecked)."""
    names = list(names)
    if len(args) > len(names):
        raise InputError(f"the model takes {len(names)} input(s) {names}, got {len(args)} "
                         f"positional argument(s) ({len(args) - len(names)} too many)")
    feeds = dict(zip(names, args))
    twice = [name for name in kwargs if name in feeds]
    if twice:
        raise InputError(f"input(s) {twice} given both positionally and by name")
    feeds.update(kwargs)
    _check_names(names, feeds)
    return feeds


def bind_run(names: Sequence[str], feeds: Any, ordered: bool = False) -> Any:
    """Inputs of ``model.run(feeds)`` by name (values unchecked); with ``ordered``, their
    values in the order of ``names`` instead."""
    if type(feeds) is dict and len(feeds) == len(names):
        # the common case: exactly the model's inputs (then every key is one of its names)
        try:
            values = [feeds[name] for name in names]
        except KeyError:
            pass
        else:
            return values if ordered else feeds
    if ordered:
        bound = bind_run(names, feeds)
        return [bound[name] for name in names]
    if isinstance(feeds, Mapping):
        not_strings = [key for key in feeds if not isinstance(key, str)]
        if not_strings:
            raise InputError(f"input names must be strings, got {not_strings!r}; the model "
                             f"takes {list(names)}")
        return bind_call(names, (), feeds)
    if isinstance(feeds, (np.ndarray, np.generic)):
        return bind_call(names, (feeds,), {})
    if isinstance(feeds, (list, tuple)):
        return bind_call(names, feeds, {})
    raise InputError(f"run() takes a dict of input name -> array or a list/tuple of arrays in "
                     f"input order {list(names)}, got {type(feeds).__name__}")


def _check_names(names: list[str], feeds: Mapping[str, Any]) -> None:
    missing = [name for name in names if name not in feeds]
    unknown = [name for name in feeds if name not in names]
    if missing or unknown:
        parts = ([f"missing input(s) {missing}"] if missing else []) + \
                ([f"unknown input(s) {unknown}"] if unknown else [])
        raise InputError(f"{'; '.join(parts)}; the model takes {len(names)} input(s) {names}")


def as_array(name: str, value: Any, expected: str) -> np.ndarray:
    """``value`` as a numpy array; ``expected`` (e.g. ``float32[2, 3]``) is for the message."""
    if isinstance(value, np.ndarray):
        return np.asarray(value)  # a subclass (matrix, masked) as a plain array
    if isinstance(value, np.generic):
        return np.asarray(value)
    raise InputError(f"input '{name}' must be a numpy array of {expected}, got "
                     f"{type(value).__name__}")


def check_array(name: str, value: np.ndarray, dtype: np.dtype, shape: Sequence[int]) -> None:
    """Exact dtype and shape, as a compiled library reads them."""
    if value.dtype != dtype:
        raise InputError(f"input '{name}' has dtype {value.dtype}; the compiled model expects "
                         f"{dtype}")
    if tuple(value.shape) != tuple(shape):
        raise InputError(f"input '{name}' has shape {tuple(value.shape)}; the compiled model "
                         f"expects {tuple(shape)} (recompile for other shapes)")


def bind_outputs(names: Sequence[str], out: Any) -> list[Any] | None:
    """The caller-given output arrays of ``out=``, one entry per output in the order of
    ``names`` (None: the model allocates that output); values are checked by the caller
    against the shapes of the call (:func:`check_output`)."""
    if out is None:
        return None
    if isinstance(out, (list, tuple)):
        if len(out) != len(names):
            raise InputError(f"out= takes one entry per output in output order {list(names)} "
                             f"(None for one the model allocates), got {len(out)}")
        return list(out)
    if isinstance(out, (np.ndarray, np.generic)):
        if len(names) != 1:
            raise InputError(f"out= takes one array per output, in a list/tuple in output "
                             f"order or a dict by name: the model has {len(names)} outputs "
                             f"{list(names)}, got a single array")
        return [out]
    if isinstance(out, Mapping):
        unknown = [key for key in out if key not in names]
        if unknown:
            raise InputError(f"out= names unknown output(s) {unknown!r}; the model's outputs "
                             f"are {list(names)}")
        return [out.get(name) for name in names]
    raise InputError(f"out= takes a list/tuple of arrays in output order {list(names)}, a "
                     f"dict output name -> array or, for one output, an array; got "
                     f"{type(out).__name__}")


def check_output(name: str, value: Any, dtype: np.dtype, shape: Sequence[int]) -> np.ndarray:
    """A caller-given output array (``out=``) a run may write, as a plain ndarray: exact dtype
    and shape, C-contiguous and writable; else an InputError naming the output."""
    array = value if type(value) is np.ndarray else \
        np.asarray(value) if isinstance(value, np.ndarray) else None
    if array is not None and array.flags.c_contiguous and array.flags.writeable and \
            array.dtype == dtype and array.shape == shape:
        return array
    expected = f"{dtype.name}{list(shape)}"
    if array is None:
        raise InputError(f"output '{name}' given in out= must be a numpy array of "
                         f"{expected}, got {type(value).__name__}")
    if array.dtype != dtype:
        raise InputError(f"output '{name}' given in out= has dtype {array.dtype}; the "
                         f"compiled model writes {expected}")
    if array.shape != tuple(shape):
        raise InputError(f"output '{name}' given in out= has shape {tuple(array.shape)}; the "
                         f"compiled model writes {expected}")
    if not array.flags.c_contiguous:
        raise InputError(f"output '{name}' given in out= is not C-contiguous (a strided or "
                         f"transposed view?); give a contiguous array of {expected}")
    if not array.flags.writeable:
        raise InputError(f"output '{name}' given in out= is read-only; give a writable array")
    return array


def call_result(names: Sequence[str], outputs: Mapping[str, Any]) -> Any:
    """What ``model(...)`` returns: the array of a one-output model, else a tuple."""
    values = tuple(outputs[name] for name in names)
    return values[0] if len(values) == 1 else values

