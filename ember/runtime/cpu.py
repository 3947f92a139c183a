"""Host CPU identification for the runtime (standard library only).

An artifact records the CPU features its code was compiled for; loading it on a machine that
lacks one of them would crash with SIGILL, so the runtime refuses with a clear error instead.
"""

from __future__ import annotations

import platform
from functools import lru_cache


@lru_cache(maxsize=1)
def host_features() -> frozenset[str]:
    """CPU feature flags of this machine (Linux: /proc/cpuinfo; elsewhere best effort)."""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    flags.update(value.split())
                    break
    except OSError:
        pass
    return frozenset(flags)


def host_arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
