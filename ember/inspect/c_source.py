"""Cut one function's definition out of a generated C translation unit.

``ember inspect --kernel`` shows the C of one kernel, and the generated source holds every
kernel plus the entry point in one file.  Matching braces naively would be fooled by the
braces inside string literals (``ember_signature`` returns a JSON text), comments and
preprocessor lines, and a search for the symbol would find its calls in ``ember_run`` first;
so this scans tokens -- comments, literals and directives as single tokens -- and accepts only
a top-level ``symbol(...) {`` as the definition.
"""

from __future__ import annotations

import re
from typing import Iterator, NamedTuple

# Only what matters for finding definitions; finditer skips everything else (operators,
# numbers, white space) without making tokens of it.
_TOKEN = re.compile(r"""
    (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<literal>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
  | (?P<directive>^[ \t]*\#(?:\\\n|[^\n])*)
  | (?P<ident>[A-Za-z_]\w*)
  | (?P<punct>[{}()\[\];])
""", re.S | re.M | re.X)
_OPENING = {"(": ")", "{": "}", "[": "]"}


class _Token(NamedTuple):
    kind: str
    text: str
    start: int
    end: int


class FunctionNotFound(LookupError):
    """The source defines no function of that name."""


def extract_c_function(source: str, symbol: str) -> str:
    """The definition of the C function ``symbol`` in ``source``: from the start of the line
    its declaration specifiers begin on to its closing brace, exactly as in ``source``."""
    span = function_spans(source).get(symbol)
    if span is None:
        raise FunctionNotFound(f"the C source defines no function '{symbol}'")
    return source[span[0]:span[1]]


def function_spans(source: str) -> dict[str, tuple[int, int]]:
    """Every function defined at the top level of ``source``: name -> (start, end) offsets,
    found in one scan (a model's source holds hundreds of kernels)."""
    tokens = [t for t in _tokens(source) if t.kind != "comment"]
    spans: dict[str, tuple[int, int]] = {}
    depth = 0
    statement_start = 0  # index of the first token of the current top-level declaration
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.kind == "directive":
            statement_start = i + 1
        elif token.text == "{":
            depth += 1
        elif token.text == "}":
            depth -= 1
            if depth == 0:
                statement_start = i + 1
        elif token.text == ";" and depth == 0:
            statement_start = i + 1
        elif depth == 0 and token.kind == "ident":
            close = _definition_body(tokens, i)
            if close is not None:
                first = tokens[statement_start]
                spans.setdefault(token.text, (source.rfind("\n", 0, first.start) + 1,
                                              tokens[close].end))
                statement_start = i = close + 1
                continue
        i += 1
    return spans
def _definition_body(tokens: list[_Token], at: int) -> int | None:
    """If ``tokens[at]`` names a function being defined, the index of its closing brace."""
    i = at + 1
    if i >= len(tokens) or tokens[i].text != "(":
        return None
    i = _matching(tokens, i)
    if i is None:
        return None
    i += 1
    while i < len(tokens) and tokens[i].text == "__attribute__":  # attributes after ')'
        if i + 1 >= len(tokens) or tokens[i + 1].text != "(":
            return None
        close = _matching(tokens, i + 1)
        if close is None:
            return None
        i = close + 1
    if i >= len(tokens) or tokens[i].text != "{":
        return None  # a prototype, a call or a function pointer
    return _matching(tokens, i)


def _matching(tokens: list[_Token], opening: int) -> int | None:
    """The index of the bracket closing ``tokens[opening]`` (None if unbalanced)."""
    stack: list[str] = []
    for i in range(opening, len(tokens)):
        text = tokens[i].text
        if text in _OPENING:
            stack.append(_OPENING[text])
        elif text in (")", "}", "]"):
            if not stack or stack.pop() != text:
                return None
            if not stack:
                return i
    return None


def _tokens(source: str) -> Iterator[_Token]:
    for match in _TOKEN.finditer(source):
        yield _Token(match.lastgroup or "punct", match.group(), match.start(), match.end())
