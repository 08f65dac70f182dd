"""The CLI's tables (``txmq ... list``), shared by every command module: aligned columns
fitted to the terminal, whole values when the output goes to a pipe or a file."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any, Sequence


#: Columns a table never cuts (what an operator copies into the next command).
_UNCUT = {"TRANSACTION", "MESSAGE ID", "STATE"}
_MIN_CUT_WIDTH = 8


def terminal_width() -> int | None:
    """``$COLUMNS``, else the terminal's width; None (no cutting) when the output goes to a
    pipe or a file, where whole values matter more than the line's width."""
    if os.environ.get("COLUMNS", "").isdigit():
        return int(os.environ["COLUMNS"])
    try:
        if not os.isatty(sys.stdout.fileno()):
            return None
    except (AttributeError, OSError, ValueError):
        return None
    return shutil.get_terminal_size((100, 24)).columns


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], width: int | None = None) -> str:
    """Aligned columns; with ``width``, the widest cuttable columns are cut (ending in "…")
    until the table fits or every one is down to 8 characters."""
    cells = [[str(h) for h in headers]] + [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    if width is not None:
        cuttable = [i for i, h in enumerate(headers) if h not in _UNCUT]
        while sum(widths) + 2 * (len(widths) - 1) > width:
            i = max(cuttable, key=lambda c: widths[c], default=None)
            if i is None or widths[i] <= _MIN_CUT_WIDTH:
                break
            widths[i] -= 1
        cells = [[v if len(v) <= w else v[:w - 1] + "…" for v, w in zip(r, widths)] for r in cells]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A table fitted to the terminal."""
    return format_table(headers, rows, terminal_width())
