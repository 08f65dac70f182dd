"""Deadline-based condition polling: wait for a state, never sleep and guess."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The condition did not hold before the deadline (an assertion failure in a test)."""


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02,
               message: str | Callable[[], str] = "condition not met",
               ignore: tuple[type[BaseException], ...] = ()) -> T:
    """Calls ``predicate`` until it returns a truthy value and returns that value.

    Raises :class:`WaitTimeout` after ``timeout`` seconds, naming ``message`` (a string, or a
    callable evaluated then, to describe the state at the deadline), the last value and the
    last ignored exception. Exceptions of the ``ignore`` types count as "not yet"."""
    deadline = time.monotonic() + timeout
    last_value: object = None
    last_error: BaseException | None = None
    while True:
        try:
            last_value = predicate()
            last_error = None
            if last_value:
                return last_value  # type: ignore[return-value]
        except ignore as exc:  # polling
            last_error = exc
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            detail = f"last value {last_value!r}"
            if last_error is not None:
                detail += f", last error {type(last_error).__name__}: {last_error}"
            raise WaitTimeout(f"after {timeout:.1f}s: {text} ({detail})")
        time.sleep(interval)
