"""Addressing every part of a JSON document by path, so manifest tampers can reach any key
however the manifest format evolves (no tamper hard-codes today's keys)."""

from __future__ import annotations

from typing import Any

Path = tuple[str | int, ...]


def all_paths(document: Any) -> list[Path]:
    """Every key and list element below the root, depth first."""
    found: list[Path] = []

    def walk(node: Any, prefix: Path) -> None:
        items = (node.items() if isinstance(node, dict) else
                 enumerate(node) if isinstance(node, list) else ())
        for key, child in items:
            found.append(prefix + (key,))
            walk(child, prefix + (key,))

    walk(document, ())
    return found


def get(document: Any, path: Path) -> Any:
    for key in path:
        document = document[key]
    return document


def replace(document: Any, path: Path, value: Any) -> None:
    get(document, path[:-1])[path[-1]] = value


def delete(document: Any, path: Path) -> None:
    del get(document, path[:-1])[path[-1]]


def render(path: Path) -> str:
    text = ""
    for key in path:
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else str(key))
    return text or "<root>"
