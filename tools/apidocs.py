"""Builds the SDK's API reference from its docstrings with pdoc (``make docs``): one HTML page
per public module into ``docs/api/`` (or the directory given). Any warning pdoc raises (a
type it cannot resolve, a broken reference) fails the build.

    python tools/apidocs.py [OUTPUT_DIR]
"""

from __future__ import annotations

import shutil
import sys
import warnings
from pathlib import Path

import pdoc

#: The public modules: what applications, services and the pipeline import (never ``txmq._x``).
MODULES = ("txmq", "txmq.aio", "txmq.anchored", "txmq.decisions", "txmq.errors", "txmq.names", "txmq.ids",
           "txmq.tls", "txmq.auth", "txmq.faults", "txmq.routes", "txmq.client", "txmq.checking",
           "txmq.sending", "txmq.tracing", "txmq.fifo", "txmq.backup")
DEFAULT_OUTPUT = Path(__file__).resolve().parents[1] / "docs" / "api"


def build(output: Path, modules: tuple[str, ...] = MODULES) -> list[str]:
    """Renders ``modules`` into ``output`` (emptied first); returns pdoc's warnings."""
    shutil.rmtree(output, ignore_errors=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdoc.pdoc(*modules, output_directory=output)
    return [f"{w.category.__name__}: {w.message}" for w in caught]


def main(argv: list[str]) -> int:
    output = Path(argv[1]) if len(argv) > 1 else DEFAULT_OUTPUT
    problems = build(output)
    for problem in problems:
        print(problem, file=sys.stderr)
    pages = sorted(p.relative_to(output).as_posix() for p in output.rglob("*.html"))
    print(f"API reference: {len(pages)} pages in {output}" + (f", {len(problems)} warning(s)" if problems else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
