"""Catalogs of hostile values: names, integers, floats and strings that break naive code.

They are listed by name so that a failing case's description says which one it used
(``name=comment-close``), which is what a developer needs to see to recognise the class of
bug (C comment injection, integer overflow, path traversal) without re-running anything.
"""

from __future__ import annotations

import math

# Names for values, nodes and graphs.  Each one targets a way a name can leak into generated
# C, JSON, file paths or error messages and change their meaning.
HOSTILE_NAMES: dict[str, str] = {
    "backslash-newline": "v\\\nint pwned;",       # a line splice ends a // comment early
    "comment-close": "v*/ int pwned = 1; /*",     # closes a /* */ comment
    "comment-open": "v/*",
    "line-comment": "v// x",
    "trigraph": "v??/\nint pwned;",               # ??/ is a backslash under -trigraphs
    "trigraph-only": "??/",
    "nul": "v\x00x",
    "nul-only": "\x00",
    "line-separator": "v\u2028x",
    "paragraph-separator": "v\u2029x",
    "next-line": "v\u0085x",
    "newline": "v\nx",
    "carriage-return": "v\rx",
    "tab": "v\tx",
    "double-quote": 'v"x',
    "single-quote": "v'x",
    "percent": "%s%n%x%p",
    "braces": "{0}{}{{",
    "shell": "$(touch /tmp/ember_fuzz_pwned)`id`",
    "path-traversal": "../../evil",
    "absolute-path": "/etc/passwd",
    "every-byte": "".join(chr(i) for i in range(1, 256)),
    "every-byte-with-nul": "".join(chr(i) for i in range(256)),
    "very-long": "v" * 100_000,
    "very-long-hostile": "*/\\\n??/" * 4_000,
    "space": " ",
    "unicode": "héllo_wörld_名前_😀",
    "right-to-left": "\u202eevil",
    "byte-order-mark": "\ufeffv",
    "c-keyword": "int",
    "c-return": "return",
    "c-main": "main",
    "entry-point": "ember_run",
    "runtime-prefix": "em_relu",
    "libc": "memcpy",
    "macro": "NAN",
    "reserved-underscore": "__attribute__",
    "digit-first": "0abc",
    "generated-like": "w0",
    "arguments-like": "inputs",
    "json": '{"name": 1}',
    "html": "<script>alert(1)</script>",
}

# Pairs of distinct names that a sanitizer mapping every bad character to "_" would merge.
COLLIDING_NAMES: list[tuple[str, str]] = [
    ("v.1", "v_1"), ("v-1", "v.1"), ("a b", "a_b"), ("k", "k_"), ("é", "_"),
    ("int", "int_"), ("W", "w"),
]

HOSTILE_INTS: dict[str, int] = {
    "zero": 0, "minus-one": -1, "minus-two": -2, "one": 1, "int32-max": 2**31 - 1,
    "int32-overflow": 2**31, "int32-min": -(2**31), "uint32-overflow": 2**32,
    "2^40": 2**40, "2^62": 2**62, "int64-max": 2**63 - 1, "int64-min": -(2**63),
    "large-negative": -1000, "hundred": 100,
}

HOSTILE_FLOATS: dict[str, float] = {
    "nan": math.nan, "inf": math.inf, "-inf": -math.inf, "-0.0": -0.0,
    "denormal": 1e-45, "float32-max": 3.4e38, "overflow": 1e39, "negative": -1.0,
    "zero": 0.0, "huge-int": 2.0**62,
}

# Dimension values for tensor shapes (dim_value is an int64).
HOSTILE_DIMS: dict[str, int] = {
    "negative": -1, "negative-large": -7, "zero": 0, "2^31": 2**31, "2^40": 2**40,
    "int64-max": 2**63 - 1, "one": 1, "large": 100_000,
}

# Strings for artifact fields (file names, dtypes, architecture names).
HOSTILE_PATHS: dict[str, str] = {
    "parent-traversal": "../../evil.so",
    "absolute-etc": "/etc/passwd",
    "absolute-so": "/lib/x86_64-linux-gnu/libc.so.6",
    "dev-zero": "/dev/zero",
    "dev-null": "/dev/null",
    "proc-self": "/proc/self/mem",
    "dot": ".",
    "dot-dot": "..",
    "empty": "",
    "nul": "model.so\x00.txt",
    "newline": "model.so\n",
    "home": "~/.bashrc",
    "very-long": "a" * 5_000,
    "backslash": "..\\..\\evil.so",
    "url": "http://example.com/evil.so",
    "trailing-slash": "model.so/",
}

HOSTILE_DTYPE_NAMES: list[str] = [
    "float128", "object", "str", "V8", "U4", "complex64", "bfloat16", "float8_e4m3fn",
    "int4", "", "float32 ", "FLOAT", "f4", "<f4", ">f4", "bool_", "datetime64",
    "float33", "void", "O",
]

# Text a terminal interprets rather than shows (kind ``cli/escapes``): escape sequences that
# clear the screen, retitle the window, write the clipboard or print a link that opens
# another URL than it shows; C1 controls (8-bit CSI, OSC, NEL); other C0 controls; and the
# bidirectional formatting characters that make text read differently from what it is.
TERMINAL_ESCAPES: dict[str, str] = {
    "clear-screen": "\x1b[2J\x1b[H",
    "full-reset": "\x1bc",
    "title-bel": "\x1b]0;pwned\x07",
    "title-st": "\x1b]2;pwned\x1b\\",
    "hyperlink": "\x1b]8;;https://evil.example\x1b\\https://good.example\x1b]8;;\x1b\\",
    "clipboard": "\x1b]52;c;ZWNobyBwd25lZA==\x07",
    "sgr-color": "\x1b[31;1m",
    "erase-line": "\x1b[5A\x1b[2K",
    "device-status-query": "\x1b[6n",
    "dcs-query": "\x1bP+q544e\x1b\\",
    "c1-csi": "\x9b2J",
    "c1-osc": "\x9d0;pwned\x9c",
    "c1-next-line": "\x85",
    "bell": "\x07",
    "backspaces": "abc\x08\x08\x08xyz",
    "carriage-return": "innocent\rEVIL",
    "vertical-tab": "a\x0bb",
    "form-feed": "a\x0cb",
    "delete": "a\x7fb",
    "nul": "a\x00b",
    "lone-escape": "\x1b",
    "bidi-override": "abc\u202edcb",
    "bidi-embedding": "\u202bx\u202c",
    "bidi-isolate": "\u2066x\u2069",
    "bidi-marks": "\u200e\u200f\u061c",
}
