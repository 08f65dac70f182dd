"""The ``txmq`` command line run as an operator runs it, against a test cluster."""

from __future__ import annotations

import subprocess
import sys


def txmq_cli(cluster, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``txmq --nameserver <cluster> --json ARGS``: exit status, JSON on stdout, errors on stderr."""
    return subprocess.run([sys.executable, "-m", "txmq", "--nameserver", cluster.nameserver_address, "--json",
                           *args], capture_output=True, text=True, timeout=timeout)
