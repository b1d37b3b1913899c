"""Tables that never cut what matters: ids, statuses and survivor counts.

A table is drawn with rich at the console's width. Columns marked `keep` (ids, the
status, survivors) never wrap; the others wrap inside their cell. If even so a kept
value would not show whole (rich shrinks every column as a last resort), the table is
drawn stacked instead: each row's kept values on a line of their own, in full (folded
onto the next line only if one value is wider than the terminal), and the other cells
indented on the lines below. Either way every kept value is printed whole.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text


@dataclass(frozen=True, slots=True)
class Col:
    name: str
    # Never wrapped nor cut: ids, statuses, survivors.
    keep: bool = False
    style: str = ""
    justify: str = "left"
    # Narrower than this (or its longest line, if shorter), a cell is no longer
    # readable: the table is drawn stacked instead.
    min_width: int = 8


def print_table(
    console: Console, columns: Sequence[Col], rows: Sequence[Sequence[str]], *, title: str = ""
) -> None:
    """Print `rows` (plain text cells, one per column) as a table that fits `console`."""
    table = _table(columns, rows, title)
    if _fits(console, table, columns, rows):
        console.print(table)
    else:
        _stacked(console, columns, rows, title)


def _table(columns: Sequence[Col], rows: Sequence[Sequence[str]], title: str) -> Table:
    table = Table(title=title or None, show_edge=False)
    for c in columns:
        table.add_column(
            c.name,
            no_wrap=c.keep,
            overflow="fold",
            style=c.style or None,
            justify=c.justify,  # type: ignore[arg-type]
        )
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


def _fits(
    console: Console, table: Table, columns: Sequence[Col], rows: Sequence[Sequence[str]]
) -> bool:
    """Whether the drawn table shows every kept cell whole, and every other cell at
    least its `min_width` wide."""
    natural = [
        max(cell_len(line) for cell in (c.name, *(r[i] for r in rows)) for line in _lines(cell))
        for i, c in enumerate(columns)
    ]
    drawn_width = Measurement.get(console, console.options.update_width(10**6), table).maximum
    overhead = drawn_width - sum(natural)
    need = sum(n if c.keep else min(n, c.min_width) for n, c in zip(natural, columns, strict=True))
    if need + overhead > console.width:
        return False
    probe = Console(width=console.width, color_system=None, record=True, file=io.StringIO())
    probe.print(table)
    drawn = probe.export_text()
    kept = [i for i, c in enumerate(columns) if c.keep]
    return all(line in drawn for row in rows for i in kept for line in row[i].splitlines())


def _lines(cell: str) -> list[str]:
    return cell.splitlines() or [""]


def _stacked(
    console: Console, columns: Sequence[Col], rows: Sequence[Sequence[str]], title: str
) -> None:
    if title:
        console.print(Text(title, style="italic"))
    kept = [i for i, c in enumerate(columns) if c.keep]
    rest = [i for i, c in enumerate(columns) if not c.keep]
    for row in rows:
        pieces = [_labelled(columns[i], row[i]) for i in kept]
        head = Text("  ").join(pieces)
        # A label never parts from its value: if the kept cells do not fit on one line,
        # each gets a line of its own (a value wider than the terminal folds).
        for line in [head] if cell_len(head.plain) <= console.width else pieces:
            console.print(line, overflow="fold")
        others = [f"{columns[i].name} {', '.join(_lines(row[i]))}" for i in rest if row[i]]
        if others:
            text = Text(" · ".join(others), style="dim")
            console.print(Padding(text, (0, 0, 0, 4)), overflow="fold")


def _labelled(column: Col, value: str) -> Text:
    text = Text(f"{column.name} ", style="dim")
    text.append(value, style=column.style or "bold")
    return text
