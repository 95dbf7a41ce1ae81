"""Key paths into a config document, and how messages spell them: ``models[0].deployments[1]``."""

from __future__ import annotations

import re

KeyPath = tuple[str | int, ...]

_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def render_path(path: KeyPath) -> str:
    """``("models", 0, "api_key")`` → ``models[0].api_key``; odd keys quoted: ``h['a.b']``."""
    text = ""
    for key in path:
        if isinstance(key, int) and not isinstance(key, bool):
            text += f"[{key}]"
        elif isinstance(key, str) and _PLAIN_KEY.match(key):
            text += f".{key}" if text else key
        else:
            text += f"[{key!r}]"
    return text or "(top level)"
