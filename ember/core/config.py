"""ember's configuration, in one place: what a user can set, how it is parsed, its defaults.

Today that is the *memory budget* of a compilation: the most memory that compiling a model may
allocate for one value, for constant folding, and for the compiled model's workspace plus
weights.  A model whose sizes exceed it is refused with a :class:`MemoryBudgetError` that names
the value and the size, before numpy tries (and fails, or swaps the machine to a halt) to
allocate it.

The budget comes from, in order of precedence:

1. ``ember.compile(..., memory_limit=...)``: bytes as an int, or a string such as ``"8GiB"``;
2. the environment variable ``EMBER_MEMORY_LIMIT`` (same syntax);
3. the memory available on this machine when the build starts (``MemAvailable`` of
   ``/proc/meminfo`` on Linux; see :func:`available_memory` for other systems).

Two more bounds keep a hostile model file from making ember work without end, each an explicit
argument where there is one, else an environment variable, else a default far above what real
models need:

* ``EMBER_MAX_INLINED_NODES`` (:func:`max_inlined_nodes`): the nodes that inlining the model's
  local functions may produce.  Thirty functions that each call the next one twice fit in 2 KB
  and expand to 2**30 nodes; the importer computes the expanded size before expanding and
  refuses the model.
* ``EMBER_MAX_LOOP_ITERATIONS`` (:func:`max_loop_iterations`): the iterations one run of a
  ``Loop`` node may make.  A trip count of 2**62, or a condition that stays true, would
  otherwise run forever.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ember.core.errors import ConfigError

MEMORY_LIMIT_ENV = "EMBER_MEMORY_LIMIT"

# Where nothing tells us the available memory: small enough that a laptop can honour it, large
# enough for every model ember benchmarks; EMBER_MEMORY_LIMIT overrides it.
FALLBACK_MEMORY_LIMIT = 8 * 2**30

# Suffixes are case-insensitive.  IEC suffixes are powers of 1024, SI ones powers of 1000; a
# bare letter (8G) means 1024s, as in ``ulimit``, ``java -Xmx8g`` and ``docker --memory``.
_UNITS = {
    "": 1, "b": 1,
    "k": 2**10, "kib": 2**10, "kb": 10**3,
    "m": 2**20, "mib": 2**20, "mb": 10**6,
    "g": 2**30, "gib": 2**30, "gb": 10**9,
    "t": 2**40, "tib": 2**40, "tb": 10**12,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(value: int | str, what: str = "memory_limit") -> int:
    """Bytes of ``value``: an int (bytes) or a string like ``"8GiB"``, ``"512 MB"``, ``"1.5g"``.

    ``what`` names the setting in the error message.  Zero and negative sizes are refused: a
    budget of nothing would refuse every model, which is never what a user means.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{what} must be a number of bytes or a string like '8GiB', got "
                          f"{type(value).__name__} {value!r:.60}")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.match(value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ConfigError(f"{what}={value!r:.60} is not a size; write bytes or a number "
                              f"with a unit: B, KiB, MiB, GiB, TiB (1024s), KB, MB, GB, TB "
                              f"(1000s), e.g. '8GiB'")
        size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ConfigError(f"{what}={value!r:.60} must be a positive size, e.g. '8GiB'")
    return size


def available_memory(meminfo: Path = Path("/proc/meminfo")) -> int:
    """Bytes of memory this machine can give a new allocation without swapping.

    Linux: ``MemAvailable`` (the kernel's estimate, page cache included).  Elsewhere: the free
    physical pages (``sysconf``), else all physical memory, else ``FALLBACK_MEMORY_LIMIT``.
    """
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                fields = line.split()
                return int(fields[1]) * (1024 if fields[2:] == ["kB"] else 1)
    except (OSError, ValueError, IndexError):
        pass
    for pages in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):
        try:
            count = os.sysconf(pages)
            page_size = os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            continue
        if count > 0 and page_size > 0:
            return count * page_size
    return FALLBACK_MEMORY_LIMIT


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def env_flag(name: str, default: bool) -> bool:
    """The on/off environment variable ``name`` (``default`` when unset): 1/true/yes/on or
    0/false/no/off, in any case; anything else is a ConfigError naming it (a typo must not
    silently mean "on")."""
    value = os.environ.get(name)
    if value is None:
        return default
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"the environment variable {name}={value!r} is neither on (1, true, "
                      f"yes, on) nor off (0, false, no, off)")


def memory_limit(explicit: int | str | None = None) -> int:
    """The memory budget in bytes: ``explicit`` if given, else ``$EMBER_MEMORY_LIMIT``, else
    the memory available now."""
    if explicit is not None:
        return parse_size(explicit)
    from_env = os.environ.get(MEMORY_LIMIT_ENV, "").strip()
    if from_env:
        return parse_size(from_env, what=f"the environment variable {MEMORY_LIMIT_ENV}")
    return available_memory()


MAX_INLINED_NODES_ENV = "EMBER_MAX_INLINED_NODES"
# An exporter can put every module of a model in a local function
# (``torch.onnx.export(..., export_modules_as_functions=True)``), so the bound must hold the
# largest real graphs: those have up to some 10**5 nodes (an 80-layer transformer).  Ten times
# that still imports in under two minutes and ~1.5 GiB (the importer makes some 10**4 nodes a
# second, each ~1.6 KiB), while an exponential expansion is refused before any of it is made.
DEFAULT_MAX_INLINED_NODES = 1_000_000

MAX_LOOP_ITERATIONS_ENV = "EMBER_MAX_LOOP_ITERATIONS"
# Real loops iterate over tokens (thousands), detection boxes (up to ~10**5) or, at the very
# most, audio samples (a minute at 24 kHz is 1.4 million).  Ten million covers minutes of audio
# sample by sample, and still stops a runaway loop: a body costs at least ~20 us a run on the
# host, so the bound is reached within minutes instead of never.
DEFAULT_MAX_LOOP_ITERATIONS = 10_000_000


def parse_count(value: int | str, what: str) -> int:
    """The positive whole number ``value``: an int, or a string of digits (``"1000000"``,
    ``"1_000_000"``).  ``what`` names the setting in the error message.  Zero is refused like a
    negative number: a bound of nothing would refuse every model, which no user means."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{what} must be a whole number, got {type(value).__name__} "
                          f"{value!r:.60}")
    count: int | None = value if isinstance(value, int) else None
    if isinstance(value, str) and re.fullmatch(r"\s*\d+(_\d+)*\s*", value):
        count = int(value)
    if count is None or count <= 0:
        raise ConfigError(f"{what}={value!r:.60} must be a positive whole number, e.g. "
                          f"10000000")
    return count


def _count_setting(explicit: int | str | None, env: str, default: int, what: str) -> int:
    """``explicit`` if given, else ``$env`` if set and not blank, else ``default``."""
    if explicit is not None:
        return parse_count(explicit, what)
    from_env = os.environ.get(env, "").strip()
    if from_env:
        return parse_count(from_env, f"the environment variable {env}")
    return default


def max_inlined_nodes(explicit: int | str | None = None) -> int:
    """The most nodes that inlining a model's local functions may produce: ``explicit`` if
    given, else ``$EMBER_MAX_INLINED_NODES``, else :data:`DEFAULT_MAX_INLINED_NODES`."""
    return _count_setting(explicit, MAX_INLINED_NODES_ENV, DEFAULT_MAX_INLINED_NODES,
                          "max_inlined_nodes")


def max_loop_iterations(explicit: int | str | None = None) -> int:
    """The most iterations one run of a ``Loop`` node may make: ``explicit`` if given, else
    ``$EMBER_MAX_LOOP_ITERATIONS``, else :data:`DEFAULT_MAX_LOOP_ITERATIONS`."""
    return _count_setting(explicit, MAX_LOOP_ITERATIONS_ENV, DEFAULT_MAX_LOOP_ITERATIONS,
                          "max_loop_iterations")


def format_size(nbytes: int) -> str:
    """``25.0 GiB (26,843,545,600 bytes)``: readable, and exact for comparisons."""
    for scale, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit} ({nbytes:,} bytes)"
    return f"{nbytes:,} bytes"


def raise_limit_hint(needed: int) -> str:
    """What a user can do when ``needed`` bytes exceed the budget."""
    suggestion = max(1, -(-needed // 2**30))  # whole GiB, rounded up
    return (f"if this machine has the memory, raise the limit with "
            f"ember.compile(..., memory_limit='{suggestion}GiB') or the environment variable "
            f"{MEMORY_LIMIT_ENV}={suggestion}GiB; otherwise use smaller input shapes")
