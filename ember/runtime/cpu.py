"""Host CPU identification for the runtime (standard library only).

An artifact records the CPU features its code was compiled for; loading it on a machine that
lacks one of them would crash with SIGILL, so the runtime refuses with a clear error instead.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path, PurePosixPath
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


def available_cpus() -> int:
    """The CPUs this process may use: its affinity mask (``sched_getaffinity``), capped by the
    tightest cgroup CPU quota on the way from its cgroup to the root (``cpu.max`` of cgroup
    v2, ``cpu.cfs_quota_us`` of v1), rounded up.  It is what a compiled library takes as its
    default thread count (the C of ``ember/codegen/c_threads.py`` reads the same files)."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    quota = _cgroup_cpu_limit()
    return max(1, min(count, quota) if quota else count)


def _cgroup_cpu_limit() -> int:
    """The tightest cgroup CPU quota of this process in whole CPUs (rounded up); 0: none."""
    limits = []
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("0::"):
                    path = PurePosixPath(line[3:].strip())
                    for directory in (path, *path.parents):
                        limits.append(_cgroup2_limit(str(directory).rstrip("/")))
    except OSError:
        pass
    limits.append(_cgroup2_limit(""))
    try:
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        if quota > 0 and period > 0:
            limits.append(-(-quota // period))
    except (OSError, ValueError):
        pass
    limits = [limit for limit in limits if limit > 0]
    return min(limits) if limits else 0


def _cgroup2_limit(directory: str) -> int:
    """The quota of ``cpu.max`` ("QUOTA PERIOD", or "max PERIOD") in a cgroup v2 directory."""
    try:
        quota, period = Path(f"/sys/fs/cgroup{directory}/cpu.max").read_text().split()[:2]
        if quota != "max" and int(period) > 0:
            return -(-int(quota) // int(period))
    except (OSError, ValueError):
        pass
    return 0


def cpu_model_name() -> str:
    """The CPU's model name as the kernel reports it (``/proc/cpuinfo``), for reports that
    must say which machine gave their figures; the architecture when it does not say."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
