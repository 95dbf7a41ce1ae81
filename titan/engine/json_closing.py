"""The shortest text that turns a prefix of a JSON document into a whole one.

JSON mode has no bound on what the model writes: a small model may still be inside a string when
``max_tokens`` runs out, and the answer would not parse. Near the end of its budget a json_object
request is steered into this suffix, token by token (engine.py). The prefix is in the layout the
grammar generates (``", "`` and ``": "`` separators, no other whitespace), and so is the suffix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_LITERALS = ("true", "false", "null")
_HEX = frozenset("0123456789abcdefABCDEF")


@dataclass
class _Scan:
    # One entry per open container: "{" or "[" and what comes next in it —
    # "key" (a key, or "}" right after "{"), "nextkey" (a key, after ","), "colon", "value",
    # "first" ("]" or a value right after "["), "after" (a "," or the closing bracket).
    containers: list[list[str]] = field(default_factory=list)
    in_string: bool = False
    is_key: bool = False
    escaped: bool = False
    unicode_digits: int = 0  # hex digits still due after "\u"
    token: str = ""  # an unfinished number or literal
    pending_space: bool = False  # the layout's space after "," or ":"

    @property
    def state(self) -> str | None:
        return self.containers[-1][1] if self.containers else None

    def set_state(self, state: str) -> None:
        if self.containers:
            self.containers[-1][1] = state

    def value_done(self) -> None:
        self.set_state("after")

    def may_start_value(self) -> bool:
        return self.state in (None, "value", "first")


def closing_suffix(prefix: str) -> str | None:
    """What to append to ``prefix`` so that it parses; None when ``prefix`` is not a prefix of a
    JSON value in that layout (the caller then leaves the request alone)."""
    scan = _Scan()
    for char in prefix:
        if not _step(scan, char):
            return None
    return _suffix(scan)


def _step(scan: _Scan, char: str) -> bool:
    if scan.in_string:
        if scan.unicode_digits:
            scan.unicode_digits -= 1
            return char in _HEX
        if scan.escaped:
            scan.escaped = False
            scan.unicode_digits = 4 if char == "u" else 0
        elif char == "\\":
            scan.escaped = True
        elif char == '"':
            scan.in_string = False
            scan.set_state("colon" if scan.is_key else "after")
        return True
    if scan.pending_space:
        scan.pending_space = False
        return char == " "
    if scan.token:
        if char.isalnum() or char in "+-.":
            scan.token += char
            return True
        scan.token = ""
        scan.value_done()
    state = scan.state
    if state in ("key", "nextkey"):
        if char == '"':
            scan.in_string, scan.is_key = True, True
            return True
        return char == "}" and state == "key" and _close(scan)
    if state == "colon":
        scan.set_state("value")
        scan.pending_space = True
        return char == ":"
    if state in ("after", "first") and char in "]}":
        bracket = scan.containers[-1][0]
        if (char == "}") != (bracket == "{") or (state == "first" and char == "}"):
            return False
        return _close(scan)
    if state == "after" and char == ",":
        scan.pending_space = True
        scan.set_state("nextkey" if scan.containers[-1][0] == "{" else "value")
        return True
    if not scan.may_start_value():
        return False
    if char == '"':
        scan.in_string, scan.is_key = True, False
    elif char in "{[":
        scan.containers.append([char, "key" if char == "{" else "first"])
    elif char.isdigit() or char in "-tfn":
        scan.token = char
    else:
        return False
    return True


def _close(scan: _Scan) -> bool:
    scan.containers.pop()
    scan.value_done()
    return True


def _finished_token(token: str) -> str:
    """What completes an unfinished number or literal."""
    for literal in _LITERALS:
        if literal.startswith(token):
            return literal[len(token) :]
    return "0" if token[-1] in "-+.eE" else ""


def _suffix(scan: _Scan) -> str:
    parts = []
    if scan.in_string:
        if scan.unicode_digits:
            parts.append("0" * scan.unicode_digits)
        elif scan.escaped:
            parts.append("\\")
        parts.append('"')
        if scan.is_key:
            parts.append(": null")
    elif scan.token:
        parts.append(_finished_token(scan.token))
    elif scan.pending_space:
        parts.append(" ")
        parts.append('"": null' if scan.state == "nextkey" else "null")
    elif scan.state == "nextkey":
        parts.append('"": null')
    elif scan.state == "colon":
        parts.append(": null")
    elif scan.state == "value":
        parts.append("null")
    parts.extend("}" if bracket == "{" else "]" for bracket, _ in reversed(scan.containers))
    return "".join(parts)
