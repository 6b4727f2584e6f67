"""Tables that fit the terminal: columns never squeezed into "us-e…", a wide table split into several.

Rich fits a table wider than the console by shrinking its columns, which turns pool keys, end reasons
and numbers into ellipses (``describe`` at 100 columns showed "us-east…" and "node-lo…"). Here no cell
wraps or shrinks; the columns are cut into as many tables as the width needs, in order, each with the
key columns (the policy, the attempt) first.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

Justify = Literal["left", "right"]


def fitted(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int, *, title: str | None = None,
           keys: int = 1, justify: Sequence[Justify] | None = None) -> list[Table]:
    """``rows`` under ``headers`` as tables at most ``width`` columns wide (unless a key column and one
    other do not fit at all), the first ``keys`` columns in every one; ``title`` over the first."""
    return [t for t, _ in _tables(headers, rows, width, title, keys, justify)]


def _tables(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int, title: str | None, keys: int,
            justify: Sequence[Justify] | None) -> Iterator[tuple[Table, int]]:
    """Each table of ``fitted`` with its width."""
    justify = justify or ["left"] * len(headers)
    for i, (cols, need) in enumerate(_layout(headers, rows, width, keys)):
        yield _table(headers, rows, justify, cols, title if i == 0 else None), need


def _layout(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int,
            keys: int) -> list[tuple[list[int], int]]:
    """(the columns of each table, its width): the key columns, then as many others as fit, in order."""
    need = [max([cell_len(headers[c]), *(cell_len(r[c]) for r in rows)]) + 3 for c in range(len(headers))]
    # (each column: its widest text, a space either side and its left border; one more border closes the row)
    key_cols = list(range(keys))
    out: list[tuple[list[int], int]] = []
    cols, used = list(key_cols), 1 + sum(need[:keys])
    for col in range(keys, len(headers)):
        if len(cols) > keys and used + need[col] > width:
            out.append((cols, used))
            cols, used = list(key_cols), 1 + sum(need[:keys])
        cols.append(col)
        used += need[col]
    out.append((cols, used))
    return out


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], justify: Sequence[Justify], cols: list[int],
           title: str | None) -> Table:
    t = Table(title=title, title_justify="left")
    for c in cols:
        t.add_column(headers[c], justify=justify[c], no_wrap=True)
    for row in rows:
        t.add_row(*(row[c] for c in cols))
    return t


PIPED_WIDTH = 100_000  # piped or redirected: one table, a line per row, whatever its width (grep, files)


def show(console: Console, headers: Sequence[str], rows: Sequence[Sequence[str]], *, title: str | None = None,
         keys: int = 1, justify: Sequence[Justify] | None = None) -> None:
    """Print ``rows`` as ``fitted`` tables: a terminal's width; piped or redirected, one table, uncut."""
    terminal = console.is_terminal
    for t, need in _tables(headers, rows, console.width if terminal else PIPED_WIDTH, title, keys, justify):
        if terminal or need <= console.width:
            console.print(t)
        else:  # (Rich renders at most the console's width, squeezing columns: a console as wide as the table)
            Console(file=console.file, width=need, color_system=None).print(t, crop=False)
