"""Fixtures of the chart tests: the helm binary (fetched by tools/fetch_helm.py, pinned by
hash) and the promtool/prometheus binaries (Debian's `prometheus` package, installed by
`make chart-tools`). A missing tool fails the tests: it never skips them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .chart import SCENARIOS, Rendered, helm_binary, render_scenario


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    return helm_binary()


def _debian_tool(name: str) -> Path:
    found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if not found:
        pytest.fail(f"{name} is not installed: run `make chart-tools` (apt-get install prometheus)")
    return Path(found)


@pytest.fixture(scope="session")
def promtool() -> Path:
    return _debian_tool("promtool")


@pytest.fixture(scope="session")
def prometheus_bin() -> Path:
    return _debian_tool("prometheus")


@pytest.fixture(scope="session")
def rendered(helm_bin: Path) -> dict[str, Rendered]:
    """Every ci/ scenario rendered once for the session."""
    return {s: render_scenario(helm_bin, s) for s in SCENARIOS}
