"""Static libraries: object files archived with the archiver that matches the C compiler.

A static library must be written by an archiver that understands the objects' format: GNU
``ar`` (or ``gcc-ar``) beside GCC, ``llvm-ar`` beside Clang, ``zig ar`` when the compiler is the
``ziglang`` package (the cross targets).  The archive gets a symbol index (``s``), which
linkers need to pull objects out of it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Sequence

from ember.toolchain.compiler import Compiler, ToolchainError

_TIMEOUT_S = 300


def archiver_command(compiler: Compiler) -> list[str]:
    """The archiver for ``compiler``'s objects, as a command prefix."""
    if compiler.family == "zig":
        return [*compiler.argv[:-1], "ar"]  # (python, -m, ziglang, cc) -> ziglang ar
    names = ("llvm-ar", "ar") if compiler.family == "clang" else ("gcc-ar", "ar")
    for name in names:
        found = shutil.which(name)
        if found:
            return [found]
    raise ToolchainError(f"no archiver for {compiler.identity!r} objects: install binutils "
                         f"(ar) or `pip install ziglang`")


def archive(compiler: Compiler, objects: Sequence[Path], out: Path) -> None:
    """Write the static library ``out`` holding ``objects`` (replacing any file there)."""
    out.unlink(missing_ok=True)
    command = [*archiver_command(compiler), "rcs", str(out), *map(str, objects)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ToolchainError(f"cannot run the archiver: {error}", command=command) from None
    if result.returncode != 0:
        raise ToolchainError(f"archiving the static library failed (exit status "
                             f"{result.returncode})", result.stderr or result.stdout,
                             command=command)
