"""A node's cores (issue 14): a broker process uses one core at the most, so a node's cores
are used by one shard per core; ``broker.coresPerShard`` is each broker pod's CPU request
(unless ``broker.resources.requests.cpu`` is set), which lets the scheduler place that."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .chart import helm, render, scenario_file, template_args


def _resources(workload: dict[str, Any]) -> dict[str, Any] | None:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return container.get("resources")


SMALL_BROKER = {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}


def test_the_small_preset_by_default(helm_bin: Path) -> None:
    r = render(helm_bin)
    assert [_resources(w) for w in r.workloads("broker")] == [SMALL_BROKER]


def test_cores_per_shard_is_each_broker_pods_cpu_request_and_only_theirs(helm_bin: Path) -> None:
    default = render(helm_bin)
    r = render(helm_bin, sets={"broker.coresPerShard": "1", "broker.replicaCount": "4"})
    [broker] = r.workloads("broker")
    assert broker["spec"]["replicas"] == 4
    assert _resources(broker) == {"requests": {"cpu": "1", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
    for component in ("nameserver", "checker", "proxy"):
        assert [_resources(w) for w in r.workloads(component)] == \
            [_resources(w) for w in default.workloads(component)], component


def test_cores_per_shard_keeps_the_other_resources_and_yields_to_an_explicit_cpu_request(helm_bin: Path) -> None:
    r = render(helm_bin, sets={"broker.coresPerShard": "2", "broker.resources.requests.memory": "1Gi",
                               "broker.resources.limits.memory": "2Gi"})
    [broker] = r.workloads("broker")
    assert _resources(broker) == {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}
    r = render(helm_bin, sets={"broker.coresPerShard": "1", "broker.resources.requests.cpu": "500m"})
    [broker] = r.workloads("broker")
    assert _resources(broker) == {"requests": {"cpu": "500m"}}


def test_every_replicated_shard_requests_its_core(helm_bin: Path) -> None:
    r = render(helm_bin, [scenario_file("replicated")])
    brokers = list(r.workloads("broker"))
    assert len(brokers) == 2  # one StatefulSet per shard
    assert all(_resources(w)["requests"]["cpu"] == "1" for w in brokers)


def test_a_negative_core_count_is_refused(helm_bin: Path) -> None:
    proc = helm(helm_bin, *template_args(sets={"broker.coresPerShard": "-1"}), check=False)
    assert proc.returncode != 0
    assert "coresPerShard" in proc.stderr
