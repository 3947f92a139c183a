"""A kernel's schedule as data: named decisions (knobs), their legal values, and a config.

Every schedule decision of a kernel -- whether a matrix product takes the GEMM template and
with which blocking, which loops run in parallel and in chunks of what size, which loop is
vectorized, the register tile of an accumulation nest, how many partial accumulators a row
reduction gets, whether guarded loops are partitioned -- is asked of a :class:`Decisions`
object by name, with the value the default heuristic proposes and the values that are legal
here.  The answers come from a :class:`KernelConfig` where it names the knob, else from the
heuristic.  Running the templates therefore both *applies* a config and *records* the
kernel's search space (:attr:`Decisions.space`) and the complete config it applied
(:attr:`Decisions.applied`), the way AutoTVM's templates define their knobs as they run.

Knob names are stable for a given unscheduled kernel: ``gemm0.tile`` (the first matrix product
met), ``nest2.parallel`` (the third top-level loop nest), ``reduction1.partials``,
``partition``.  Values are JSON scalars or tuples of ints, so a config is stored as JSON in a
tuning database and read back unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ember.core.errors import ConfigError

Value = bool | int | str | tuple[int, ...] | None


class ScheduleConfigError(ConfigError, ValueError):
    """A config names a knob the kernel does not have, or a value the knob does not allow
    (``knob`` names it when there is one)."""

    def __init__(self, message: str, knob: str | None = None):
        super().__init__(message)
        self.knob = knob


def normalize_value(value: Any) -> Value:
    """A knob value in its canonical form (JSON lists become tuples of ints)."""
    # (int.__int__: a knob value is a plain number; a traced size that reached one reads
    # its sample, and the build's second trace refuses code that depends on it)
    if isinstance(value, list | tuple):
        return tuple(int.__int__(v) for v in value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int.__int__(value)
    if value is None or isinstance(value, bool | str):
        return value
    raise ScheduleConfigError(f"knob values are bools, ints, strings, tuples of ints or "
                              f"None; got {value!r} ({type(value).__name__})")


@dataclass(frozen=True)
class Knob:
    """One decision of one kernel: its name, the heuristic's value and the legal values."""

    name: str
    default: Value
    choices: tuple[Value, ...]
    doc: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "default": self.default, "choices": list(self.choices),
                "doc": self.doc}


@dataclass(frozen=True)
class KernelConfig:
    """Knob name -> value for one kernel.  A config need not name every knob: the others take
    the default heuristic's value.  Hashable and comparable, so configs key caches."""

    values: tuple[tuple[str, Value], ...] = ()

    def __post_init__(self) -> None:
        canonical = tuple(sorted((str(k), normalize_value(v)) for k, v in self.values))
        object.__setattr__(self, "values", canonical)

    @classmethod
    def of(cls, mapping: Mapping[str, Any] | None = None, **knobs: Any) -> "KernelConfig":
        """``KernelConfig.of({"nest0.vectorize": False})``, ``KernelConfig.of(partition=False)``."""
        return cls(tuple({**dict(mapping or {}), **knobs}.items()))

    def as_dict(self) -> dict[str, Value]:
        return dict(self.values)

    def get(self, name: str, default: Value = None) -> Value:
        return self.as_dict().get(name, default)

    def with_values(self, **knobs: Any) -> "KernelConfig":
        return KernelConfig.of({**self.as_dict(), **knobs})

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "KernelConfig":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ScheduleConfigError(
                f"a kernel config must be a JSON object: {error}") from None
        if not isinstance(data, dict):
            raise ScheduleConfigError(f"a kernel config must be a JSON object of knob values, "
                                      f"got {type(data).__name__}")
        return cls.of(data)

    def __len__(self) -> int:
        return len(self.values)

    def __str__(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.values) or "(defaults)"


@dataclass
class Decisions:
    """Answers the templates' questions from ``config``, recording the space and the answers.

    ``choose`` is the one place a schedule decision is made: the template passes the value its
    heuristic proposes and the legal values; a config value outside them is an error (a
    stale database record must not silently build something else)."""

    config: KernelConfig = field(default_factory=KernelConfig)
    kernel: str = ""
    space: list[Knob] = field(default_factory=list)
    applied: dict[str, Value] = field(default_factory=dict)

    def choose(self, name: str, default: Any, choices: Iterable[Any], doc: str = "") -> Any:
        default = normalize_value(default)
        legal = tuple(dict.fromkeys([default, *(normalize_value(c) for c in choices)]))
        if name in self.applied:
            raise ScheduleConfigError(
                f"{self.kernel}: knob '{name}' asked twice (a template bug)")
        self.space.append(Knob(name, default, legal, doc))
        wanted = self.config.as_dict().get(name, default)
        if wanted not in legal:
            raise ScheduleConfigError(
                f"{self.kernel}: knob '{name}' cannot be {wanted!r} here; its legal values "
                f"are {list(legal)}", knob=name)
        self.applied[name] = wanted
        return wanted

    def check_all_used(self) -> None:
        """Every knob of the config was asked for (else it was made for another kernel)."""
        unused = sorted(set(self.config.as_dict()) - set(self.applied))
        if unused:
            known = ", ".join(k.name for k in self.space) or "none"
            raise ScheduleConfigError(
                f"{self.kernel}: the config sets knob(s) {unused} that this kernel does not "
                f"have (its knobs: {known})", knob=unused[0])

    @property
    def applied_config(self) -> KernelConfig:
        return KernelConfig.of(self.applied)
