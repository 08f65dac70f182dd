"""A manual clock in milliseconds, as the broker's core reads time (``clock=``): tests move
it with :meth:`Clock.advance` instead of sleeping."""

from __future__ import annotations


class Clock:
    def __init__(self, ms: int = 1_700_000_000_000) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms

    def advance(self, seconds: float) -> None:
        self.ms += int(seconds * 1000)
