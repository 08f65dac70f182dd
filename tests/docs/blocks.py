"""The code blocks of README.md and docs/: which run, and how (docs/writing-docs.md).

A fenced block whose info string is ``sh``, ``bash`` or ``python`` runs; any other
(``text``, ``console``, ``yaml``, ``pycon``, none) is an illustration. An HTML comment on the
line right above the fence changes how a block runs:

    <!-- docs-test: background until="services are running" -->   start, wait for the line, Ctrl-C
    <!-- docs-test: timeout=120 -->                                  seconds before it fails (default 60)
    <!-- docs-test: skip="why" -->                                   not run; the reason is required
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUN = {"sh": "sh", "bash": "sh", "python": "python"}
_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*docs-test:(?P<body>.*?)-->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    language: str
    code: str
    options: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def kind(self) -> str | None:
        """``sh`` or ``python`` when it runs, None for an illustration."""
        return RUN.get(self.language)


#: Pages whose blocks another test runs, against what they need beyond this test's cluster.
RUN_ELSEWHERE = {
    "docs/anchored-transactions.md": "tests/integration/test_anchored_docs.py (a PostgreSQL database too)",
}


def pages() -> list[Path]:
    """README.md and every page of docs/."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def documents() -> list[Path]:
    """The pages whose blocks this test runs."""
    return [p for p in pages() if str(p.relative_to(REPO)) not in RUN_ELSEWHERE]


def parse_options(body: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for word in shlex.split(body):
        key, _, value = word.partition("=")
        if key not in ("background", "until", "timeout", "skip"):
            raise ValueError(f"unknown docs-test option {key!r}")
        options[key] = value
    return options


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, with the directive above it."""
    found: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m.group("fence"), m.group("info").strip()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        directive = _DIRECTIVE.match(lines[start - 1]) if start else None
        options = parse_options(directive.group("body")) if directive else {}
        found.append(Block(path, start + 1, info.split()[0] if info else "", "\n".join(body) + "\n", options))
    return found


def every_block() -> list[Block]:
    return [b for p in documents() for b in blocks(p)]
