"""`txmq topic create --exist-ok`: what the chart's topics Job runs at every install and
upgrade, so applying the same declared topics again must succeed, and a declared type that
contradicts the topic's must still fail, naming both."""

from __future__ import annotations

import json
import subprocess
import sys


def _cli(cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "txmq", "--nameserver", cluster.nameserver_address, *args],
                          capture_output=True, text=True, timeout=60)


def test_exist_ok_applies_a_declared_topic_again_and_refuses_another_type(cluster, unique_name) -> None:
    topic = unique_name("declared")
    first = _cli(cluster, "--json", "topic", "create", topic, "--type", "fifo", "--queues", "2", "--exist-ok")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["type"] == "FIFO"
    cluster.wait_route(topic, 2)

    # Without the flag a second create is an error (as before) ...
    again = _cli(cluster, "topic", "create", topic, "--type", "fifo", "--queues", "2")
    assert again.returncode == 1 and "already exists" in again.stderr, again
    # ... with it, the same declaration is a success that changes nothing.
    applied = _cli(cluster, "--json", "topic", "create", topic, "--type", "fifo", "--queues", "2", "--exist-ok")
    assert applied.returncode == 0, applied.stderr
    data = json.loads(applied.stdout)
    assert data["existed"] is True and data["type"] == "FIFO" and sum(data["brokers"].values()) == 2
    text = _cli(cluster, "topic", "create", topic, "--type", "fifo", "--queues", "2", "--exist-ok")
    assert text.returncode == 0 and "nothing to do" in text.stdout, text

    # A declaration of the other type is refused, naming both types.
    other = _cli(cluster, "topic", "create", topic, "--queues", "2", "--exist-ok")
    assert other.returncode == 1, other
    assert "exists as a FIFO topic, not NORMAL" in other.stderr, other.stderr
    described = json.loads(_cli(cluster, "--json", "topic", "describe", topic).stdout)
    assert described["type"] == "FIFO" and len(described["queues"]) == 2
