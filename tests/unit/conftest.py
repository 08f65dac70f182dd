"""The unit tier is pure: no test here (nor its fixtures) starts a process
(tests/support/purity.py). A test that needs one lives in tests/integration."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.support.purity import no_processes


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
