"""Tables as the reports build them for Markdown (title -> header, rows), printed as rich tables:
``titan plan`` and the repository's benchmarks."""

from __future__ import annotations

from typing import Any


def print_tables(tables: dict[str, tuple[list[str], list[list[str]]]], console: Any) -> None:
    """Title -> (header, rows), as the reports build them for Markdown, as rich tables (bold
    markers dropped)."""
    from rich.table import Table

    for title, (header, rows) in tables.items():
        table = Table(title=title)
        for column in header:
            table.add_column(column)
        for row in rows:
            table.add_row(*(cell.replace("**", "") for cell in row))
        console.print(table)
