"""Reading a service's /metrics."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(port: int) -> str:
    """The /metrics text of the service whose metrics port is ``port``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def metric(port: int, name: str, labels: dict[str, str] | None = None) -> float | None:
    """The sample ``name`` with exactly ``labels`` (None if there is none)."""
    want = labels or {}
    for family in text_string_to_metric_families(scrape(port)):
        for sample in family.samples:
            if sample.name == name and sample.labels == want:
                return sample.value
    return None


def metric_sum(port: int, name: str, labels: dict[str, str] | None = None) -> float:
    """The sum of the samples ``name`` whose labels include ``labels`` (0 if none)."""
    total = 0.0
    for family in text_string_to_metric_families(scrape(port)):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in (labels or {}).items()):
                total += sample.value
    return total
