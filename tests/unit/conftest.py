"""The unit tier is pure: no test here (nor its fixtures) starts a process
(tests/support/purity.py). A test that needs one lives in tests/integration.

Fixtures the broker's tests share: ``clock`` (a manual clock, tests/support/clock.py) and
``make_core`` (broker cores on a store in the test's directory, closed after it; a module
that wants other defaults overrides it with a ``make_core(make_core)`` of its own)."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import pytest

from services.broker.config import BrokerConfig
from services.broker.core import BrokerCore
from tests.support.clock import Clock
from tests.support.purity import no_processes


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make_core(tmp_path, clock):
    cores: list[BrokerCore] = []

    def make(**overrides: Any) -> BrokerCore:
        config = dataclasses.replace(BrokerConfig(data_dir=str(tmp_path / "store"), flush="async"), **overrides)
        core = BrokerCore(config, clock=clock)
        cores.append(core)
        return core

    yield make
    for core in cores:
        try:
            core.close()
        except Exception:  # noqa: BLE001 - a test may have closed or broken it already
            pass


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with no_processes():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with no_processes():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    with no_processes():
        return (yield)
