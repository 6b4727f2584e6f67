"""The CLI's tables on narrow terminals: whole values, the columns split into tables, never "us-e…"."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from spotrelay.cli.tables import fitted, show

POOL = "us-east-1/us-east-1a/p5.48xlarge/spot"
HEADERS = ("attempt", "pool", "nodes", "started (UTC)", "ended (UTC)", "end reason", "resumed from", "reached",
           "lost", "cost $")
ROWS = [["1", POOL, "16", "12-06 19:40:29", "12-06 20:11:02", "node-lost", "start", "45", "5", "1234.56"],
        ["2", POOL, "16", "12-06 20:16:40", "-", "running", "step 40", "-", "-", "88.10"]]


@pytest.mark.parametrize("width", [60, 80, 100, 120])
def test_each_table_fits_the_width_with_the_key_column_and_every_value_whole(width: int) -> None:
    tables = fitted(HEADERS, ROWS, width, title="attempts")
    console = Console(width=width, record=True, file=io.StringIO())
    for t in tables:
        console.print(t)
    text = console.export_text()
    assert "…" not in text and max(len(line.rstrip()) for line in text.splitlines()) <= width
    assert all(t.columns[0].header == "attempt" for t in tables)
    assert [c.header for t in tables for c in t.columns[1:]] == list(HEADERS[1:])  # each once, in order
    for value in {v for row in ROWS for v in row}:
        assert value in text
    assert tables[0].title == "attempts" and all(t.title is None for t in tables[1:])


def test_a_wide_terminal_gets_one_table() -> None:
    assert len(fitted(HEADERS, ROWS, 200)) == 1


def test_piped_output_is_one_table_a_line_per_row_however_narrow_the_console() -> None:
    """grep and files: a row per line, whole (Rich alone would squeeze it to the console's 80 columns)."""
    sink = io.StringIO()
    show(Console(file=sink, width=80), HEADERS, ROWS, title="attempts")
    lines = sink.getvalue().splitlines()
    assert "…" not in sink.getvalue()
    rows = [line for line in lines if line.startswith("│")]
    assert len(rows) == 2 and all(POOL in r and ("node-lost" in r or "running" in r) for r in rows)
    assert "1234.56" in rows[0] and "cost $" in next(line for line in lines if line.startswith("┃"))


def test_a_terminal_gets_tables_that_fit_it() -> None:
    sink = io.StringIO()
    show(Console(file=sink, width=80, force_terminal=True, color_system=None), HEADERS, ROWS)
    text = sink.getvalue()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    assert text.count("┏") > 1  # more than one table
