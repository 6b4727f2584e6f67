"""Tables that fit the terminal: columns never squeezed into "us-e…", a wide table split into several.

Rich fits a table wider than the console by shrinking its columns, which turns pool keys, end reasons
and numbers into ellipses (``describe`` at 100 columns showed "us-east…" and "node-lo…"). Here no cell
wraps or shrinks; the columns are cut into as many tables as the width needs, in order, each with the
key columns (the policy, the attempt) first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

Justify = Literal["left", "right"]


def fitted(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int, *, title: str | None = None,
           keys: int = 1, justify: Sequence[Justify] | None = None) -> list[Table]:
    """``rows`` under ``headers`` as tables at most ``width`` columns wide (unless a key column and one
    other do not fit at all), the first ``keys`` columns in every one; ``title`` over the first."""
    justify = justify or ["left"] * len(headers)
    need = [max([cell_len(headers[c]), *(cell_len(r[c]) for r in rows)]) + 3 for c in range(len(headers))]
    base = 1 + sum(need[:keys])  # (each column: its text, a space either side and a border; one more border)
    groups: list[list[int]] = [[]]
    for col in range(keys, len(headers)):
        if groups[-1] and base + sum(need[c] for c in groups[-1]) + need[col] > width:
            groups.append([])
        groups[-1].append(col)
    key_cols = list(range(keys))
    return [_table(headers, rows, justify, [*key_cols, *g], title if i == 0 else None) for i, g in enumerate(groups)]


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], justify: Sequence[Justify], cols: list[int],
           title: str | None) -> Table:
    t = Table(title=title, title_justify="left")
    for c in cols:
        t.add_column(headers[c], justify=justify[c], no_wrap=True)
    for row in rows:
        t.add_row(*(row[c] for c in cols))
    return t


def _width(t: Table) -> int:
    """Columns ``t`` takes with no cell wrapped."""
    console = Console(width=100_000)
    return Measurement.get(console, console.options, t).maximum


PIPED_WIDTH = 100_000  # piped or redirected: one table, a line per row, whatever its width (grep, files)


def show(console: Console, headers: Sequence[str], rows: Sequence[Sequence[str]], *, title: str | None = None,
         keys: int = 1, justify: Sequence[Justify] | None = None) -> None:
    """Print ``rows`` as ``fitted`` tables: a terminal's width; piped or redirected, one table, uncut."""
    terminal = console.is_terminal
    for t in fitted(headers, rows, console.width if terminal else PIPED_WIDTH, title=title, keys=keys,
                    justify=justify):
        need = _width(t)
        if terminal or need <= console.width:
            console.print(t)
        else:  # (Rich renders at most the console's width, squeezing columns: a console as wide as the table)
            Console(file=console.file, width=need, color_system=None).print(t, crop=False)
