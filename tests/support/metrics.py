"""Reading one sample from a service's /metrics."""

from __future__ import annotations

import re
import urllib.request


def metric(port: int, name: str, labels: dict[str, str] | None = None) -> float | None:
    """The value of ``name`` with exactly ``labels`` on the /metrics of ``port`` (None if absent)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in sorted((labels or {}).items()))
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:]+)(?:\{(.*)\})? (\S+)$", line)
        if m and m.group(1) == name:
            got = ",".join(sorted((m.group(2) or "").split(","))) if m.group(2) else ""
            if got == want:
                return float(m.group(3))
    return None
