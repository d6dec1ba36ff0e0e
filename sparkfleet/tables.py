"""Tables a person reads: they fit the terminal they are read in, and are plain text anywhere else.

Every command's tables share one style: a rule under the header on a terminal; off a terminal (a pipe, a file,
cron's mail) no box drawing, and no colour or escape codes (rich writes none where output is not a terminal).
The width is the console's: the terminal's, else $COLUMNS, else 80.

A table with more columns than a terminal holds (`sparkfleet status`) keeps its key columns whole, adds the
others in order while they fit, and folds the rest into a detail line under each row. `wide` (a command's
`--wide`, as kubectl's `-o wide`) keeps every column in the row, however long the line, and lets the terminal
wrap it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

GAP = "  "  # between columns, as a rich table without a box pads them
INDENT = "  "  # a detail line under its row


def table(console: Console, title: str | None = None) -> Table:
    """A rich table in the one style; its columns and rows are the caller's."""
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD if console.is_terminal else None,
                 show_edge=False, pad_edge=False)


@dataclass(frozen=True)
class Column:
    header: str
    key: bool = False  # always in the row; the other columns are there while they fit, else in the detail line
    right: bool = False  # numbers


def print_folded(console: Console, title: str, columns: Sequence[Column], rows: Sequence[Sequence[str]],
                 wide: bool = False) -> None:
    """Print `rows` (rich markup, one cell per column) as a table that fits the console, or every column if `wide`."""
    console.print(Text(title, style="bold"))
    for line in folded_lines(console, columns, rows, wide):
        console.print(line, soft_wrap=True)  # never wrapped by rich: the fit is done here


def folded_lines(console: Console, columns: Sequence[Column], rows: Sequence[Sequence[str]], wide: bool) -> list[Text]:
    cells = [[Text.from_markup(cell) for cell in row] for row in rows]
    widths = [max([len(column.header)] + [row[i].cell_len for row in cells]) for i, column in enumerate(columns)]
    shown = list(range(len(columns))) if wide else _fit(columns, widths, console.width)
    hidden = [i for i in range(len(columns)) if i not in shown]

    def line(texts: Sequence[Text]) -> Text:
        parts = []
        for i in shown:
            text = texts[i].copy()
            text.align("right" if columns[i].right else "left", widths[i])
            parts.append(text)
        joined = Text(GAP).join(parts)
        joined.rstrip()
        return joined

    lines = [line([Text(column.header, style="bold") for column in columns])]
    if console.is_terminal:
        lines.append(Text("─" * _width(widths, shown), style="dim"))
    for row in cells:
        lines.append(line(row))
        pairs = [Text.assemble(f"{columns[i].header}: ", row[i]) for i in hidden if row[i].plain not in ("", "-")]
        lines += _details(pairs, console.width)
    return lines


def _width(widths: Sequence[int], shown: Sequence[int]) -> int:
    return sum(widths[i] for i in shown) + len(GAP) * (len(shown) - 1)


def _fit(columns: Sequence[Column], widths: Sequence[int], width: int) -> list[int]:
    """The key columns, then the others in order while the line fits (none after the first that does not)."""
    shown = [i for i, column in enumerate(columns) if column.key]
    for i, column in enumerate(columns):
        if column.key:
            continue
        wider = sorted([*shown, i])
        if _width(widths, wider) > width:
            break
        shown = wider
    return shown


def _details(pairs: list[Text], width: int) -> list[Text]:
    """`header: value` pairs under a row, packed into lines of `width` (a pair is never split)."""
    lines: list[Text] = []
    for pair in pairs:
        if lines and lines[-1].cell_len + len(GAP) + pair.cell_len <= width:
            lines[-1].append(GAP).append_text(pair)
        else:
            lines.append(Text(INDENT).append_text(pair))
    for line in lines:
        line.stylize("dim")
    return lines
