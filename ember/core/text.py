"""Text from a model, made safe for a terminal.

Names, doc strings and error messages of a model reach ``ember inspect``, ``run``,
``profile`` and ``compile`` output.  A terminal interprets control characters in them: an
escape sequence can clear the screen, set the window title, or print an OSC 8 link that
shows one URL and opens another; a Unicode bidirectional override can make text read
differently from what it is.  :func:`printable` writes every such character as an escape
(``\\x1b``, ``\\u202e``), as the C generator's sanitizer does for generated code; every
console of the command line (:class:`TerminalConsole`) passes all the text it prints
through it, so no print site can forget to.
"""

from __future__ import annotations

import re
from typing import Iterable

from rich.console import Console
from rich.segment import Segment

# C0 controls but tab and newline, DEL, C1 controls, and the bidirectional formatting
# characters (embeddings, overrides, isolates, and the marks that reorder text).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                     "\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control and bidirectional formatting character escaped."""
    return _UNSAFE.sub(_escape, text)


class TerminalConsole(Console):
    """A rich Console that escapes control characters in everything it prints (the text of
    each segment, before rich adds its own styling codes)."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        safe = (segment if segment.control else
                Segment(printable(segment.text), segment.style, segment.control)
                for segment in buffer)
        return super()._render_buffer(safe)
