"""`make e2e-k8s` without a cluster: it must say so and fail, never pretend to pass."""

from __future__ import annotations

import os
import subprocess
import sys

from .chart import REPO


def test_e2e_k8s_reports_no_cluster_and_exits_non_zero(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
    env["KUBECONFIG"] = str(tmp_path / "no-such-kubeconfig")
    env["HOME"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "tests.chart.e2e_k8s"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no Kubernetes cluster is configured" in proc.stderr
    assert "NOT RUN" in proc.stderr and "PASSED" not in proc.stdout
