"""Fail points for crash tests: ``TXMQ_FAILPOINT=<step>`` makes the broker SIGKILL itself
when it reaches that step (the steps of the multi-message transaction protocol, see
``globaltx.py``). Read once at import: unset, :func:`hit` is one comparison with an empty
string and nothing else.
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)

#: The armed step ('' when none).
ARMED = os.environ.get("TXMQ_FAILPOINT", "")

#: Every step a fail point exists for (a test names one of these).
STEPS = (
    "begin.before", "begin.after",      # coordinator: storing the first message (G PREPARED)
    "part.before", "part.after",        # participant: storing a further part
    "decide.before", "decide.after",    # coordinator: G's decision batch (the commit point)
    "push.before", "push.after",        # coordinator: telling a participant (ApplyGlobal)
    "apply.before", "apply.after",      # participant: applying G's decision to its parts
    "pull.before",                      # participant: asking the coordinator (ResolveGlobal)
    "resolve.before",                   # coordinator: answering that question
)


def hit(step: str) -> None:
    """Dies here (SIGKILL: no cleanup, no flush) when ``step`` is the armed one."""
    if ARMED and step == ARMED:
        log.critical("fail point %s reached: killing the process", step)
        os.kill(os.getpid(), signal.SIGKILL)
