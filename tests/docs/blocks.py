"""The fenced command blocks of README.md and docs/*.md, and how each is marked for the walk.

A marker is an HTML comment (invisible on GitHub) on the line before a block's fence:

- ``<!-- doc-run -->``: the walk runs the block as written; it must exit 0 and print no
  OpenAI error body;
- ``<!-- doc-run: background, ready URL -->``: the walk starts it in the background (it serves
  until the walk ends) and waits until ``URL`` answers 200;
- ``<!-- doc-skip: REASON -->``: not run, for the reason given (a cluster, a real upstream...).

Every ``sh``/``bash`` block carries one; other blocks (python, yaml) may.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMAND_LANGUAGES = ("sh", "bash", "shell", "console")
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[^\n]*$")
_MARKER = re.compile(r"^\s*<!--\s*doc-(?P<kind>run|skip)\s*(?::\s*(?P<args>.*?))?\s*-->\s*$")
_READY = re.compile(r"^background,\s*ready\s+(?P<url>https?://\S+)$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    body: str
    marker: str | None  # "run", "skip" or None (unmarked)
    args: str  # the marker's text after the colon: a reason, or "background, ready URL"

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def ready_url(self) -> str | None:
        """The URL a background block serves, once it is up; None for a foreground block."""
        match = _READY.match(self.args)
        return match.group("url") if match else None

    @property
    def is_command(self) -> bool:
        return self.language in COMMAND_LANGUAGES


def documents() -> list[Path]:
    """The walk's order: the README first, then the docs, as a newcomer reads them."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").split("\n")
    found, index = [], 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        end = index + 1
        closing = re.compile(rf"^{re.escape(opening.group('indent'))}```\s*$")
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        previous = next((line for line in reversed(lines[:index]) if line.strip()), "")
        marker = _MARKER.match(previous)
        indent = len(opening.group("indent"))
        body = "\n".join(line[indent:] for line in lines[index + 1 : end])
        found.append(
            Block(
                path=path,
                line=index + 1,
                language=opening.group("lang"),
                body=body + "\n",
                marker=marker.group("kind") if marker else None,
                args=(marker.group("args") or "") if marker else "",
            )
        )
        index = end + 1
    return found
