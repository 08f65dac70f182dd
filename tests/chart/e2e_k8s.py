"""`make e2e-k8s`: the chart on a real Kubernetes cluster (layer 5).

    KUBECONFIG=~/.kube/config TXMQ_E2E_IMAGE_REGISTRY=ghcr.io/acme TXMQ_E2E_IMAGE_TAG=0.1.0 \\
        python -m tests.chart.e2e_k8s

With a cluster (KUBECONFIG, ~/.kube/config or in-cluster) and the four images pushed
(deploy/docker/), it installs the chart with helm into a fresh namespace with its default
values (TLS from the chart's CA, auth with generated credentials, closed NetworkPolicies)
and one declared topic (created by the chart's hook Job), waits for the rollout with the
`kubernetes` client, runs the end-to-end transaction scenario in a pod of the cluster
labelled as a client, with the admin's token and certificate (broker and checker addresses
are pod DNS names, reachable only inside it), deletes broker pod 0 and waits for it to come back with its volume, runs the
scenario again (and checks the message committed before the kill is still there), then
uninstalls and deletes the namespace.

Without a cluster it says so and exits 2: it never reports a pass it did not run.
Nothing here is mocked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

from tests.chart.chart import CHART

NO_CLUSTER_EXIT = 2
ROLLOUT_SECONDS = 600


def load_cluster() -> str | None:
    """The configured cluster's description, or None when there is none."""
    try:
        from kubernetes import client, config
    except ImportError:
        print("e2e-k8s: the `kubernetes` package is missing: make venv (requirements/chart.txt)", file=sys.stderr)
        return None
    try:
        config.load_kube_config()
    except Exception as exc:  # noqa: BLE001 - any failure means "no usable kubeconfig"
        try:
            config.load_incluster_config()
        except Exception:  # noqa: BLE001 - neither configuration: no cluster to test
            print(f"e2e-k8s: no Kubernetes cluster is configured (KUBECONFIG={os.environ.get('KUBECONFIG', '')!r}: "
                  f"{exc}); nothing was run.", file=sys.stderr)
            return None
    try:
        version = client.VersionApi().get_code(_request_timeout=10)
    except Exception as exc:  # noqa: BLE001 - an unreachable cluster, whatever the error
        print(f"e2e-k8s: the configured cluster does not answer ({exc}); nothing was run.", file=sys.stderr)
        return None
    return f"Kubernetes {version.git_version}"


SCENARIO = textwrap.dedent('''
    import os, sys, time, txmq
    ns, topic, phase = sys.argv[1], sys.argv[2], sys.argv[3]
    # The admin's credentials, mounted from the Secrets the chart generated; the topic came
    # from the chart's topics Job.
    client = {"token": os.environ["TXMQ_TOKEN"], "tls": txmq.TLS(
        ca_file="/etc/txmq/tls/ca.crt", cert_file="/etc/txmq/tls/tls.crt", key_file="/etc/txmq/tls/tls.key")}
    class L(txmq.TransactionListener):
        def execute_local_transaction(self, m, a): return txmq.LocalTransactionState.UNKNOWN
        def check_local_transaction(self, m): return txmq.LocalTransactionState.COMMIT
    with txmq.TransactionProducer(ns, producer_group="e2e-" + phase, listener=L(), **client) as p:
        p.send_in_transaction(txmq.Message(topic, phase.encode()))
        got, deadline = set(), time.monotonic() + 120
        with txmq.SimpleConsumer(ns, consumer_group="e2e-" + phase, subscriptions={topic: "*"}, **client) as c:
            while time.monotonic() < deadline and not ({b"first", phase.encode()} <= got):
                for m in c.receive(16):
                    got.add(m.body); c.ack(m)
    ok = {b"first", phase.encode()} <= got
    print("E2E", "OK" if ok else "FAILED", sorted(got), flush=True)
    sys.exit(0 if ok else 1)
''')


def run() -> int:
    from kubernetes import client
    from tools.fetch_helm import fetch

    helm = str(fetch())
    namespace = f"txmq-e2e-{uuid.uuid4().hex[:6]}"
    release = "txmq"
    core, apps = client.CoreV1Api(), client.AppsV1Api()
    sets = ["--set", f"global.imageRegistry={os.environ.get('TXMQ_E2E_IMAGE_REGISTRY', '')}",
            "--set", f"image.tag={os.environ.get('TXMQ_E2E_IMAGE_TAG', '')}",
            "--set", "topics[0].name=e2e-orders", "--set", "topics[0].queues=4"]
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    try:
        subprocess.run([helm, "install", release, str(CHART), "-n", namespace, "--wait",
                        "--timeout", f"{ROLLOUT_SECONDS}s", *sets], check=True)
        wait_rollout(apps, namespace)
        nameserver = f"{release}-nameserver.{namespace}.svc.cluster.local:9876"
        image = apps.read_namespaced_stateful_set(f"{release}-broker", namespace).spec.template.spec.containers[0].image
        scenario(core, namespace, image, nameserver, "first", release)
        print("e2e-k8s: deleting pod txmq-broker-0")
        core.delete_namespaced_pod(f"{release}-broker-0", namespace)
        wait_rollout(apps, namespace)
        scenario(core, namespace, image, nameserver, "after-kill", release)
        print("e2e-k8s: PASSED")
        return 0
    finally:
        subprocess.run([helm, "uninstall", release, "-n", namespace, "--wait"], check=False)
        core.delete_namespace(namespace)


def wait_rollout(apps, namespace: str) -> None:
    deadline = time.monotonic() + ROLLOUT_SECONDS
    while time.monotonic() < deadline:
        sts = apps.list_namespaced_stateful_set(namespace).items
        deps = apps.list_namespaced_deployment(namespace).items
        if all((s.status.ready_replicas or 0) == s.spec.replicas for s in sts) and \
                all((d.status.ready_replicas or 0) == d.spec.replicas for d in deps):
            return
        time.sleep(2)
    raise TimeoutError(f"rollout in {namespace} not ready after {ROLLOUT_SECONDS}s")


def scenario(core, namespace: str, image: str, nameserver: str, phase: str, release: str) -> None:
    from kubernetes import client

    name = f"e2e-{phase}"
    token = client.V1EnvVar(name="TXMQ_TOKEN", value_from=client.V1EnvVarSource(
        secret_key_ref=client.V1SecretKeySelector(name=f"{release}-admin", key="token")))
    core.create_namespaced_pod(namespace, client.V1Pod(
        # The label the chart's NetworkPolicies let in.
        metadata=client.V1ObjectMeta(name=name, labels={f"{release}-client": "true"}),
        spec=client.V1PodSpec(restart_policy="Never", containers=[client.V1Container(
            name="scenario", image=image, command=["python", "-c", SCENARIO, nameserver, "e2e-orders", phase],
            env=[token], volume_mounts=[client.V1VolumeMount(name="tls", mount_path="/etc/txmq/tls", read_only=True)])],
            volumes=[client.V1Volume(name="tls", secret=client.V1SecretVolumeSource(secret_name=f"{release}-admin-tls"))])))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, namespace)
        if pod.status.phase in ("Succeeded", "Failed"):
            print(core.read_namespaced_pod_log(name, namespace))
            if pod.status.phase != "Succeeded":
                raise SystemExit(f"e2e-k8s: scenario {phase} failed")
            return
        time.sleep(2)
    raise TimeoutError(f"scenario pod {name} did not finish")


def main() -> int:
    cluster = load_cluster()
    if cluster is None:
        print("e2e-k8s: NOT RUN (no cluster). Point KUBECONFIG at a cluster that can pull the txmq images "
              "(deploy/docker/) to run it.", file=sys.stderr)
        return NO_CLUSTER_EXIT
    print(f"e2e-k8s: using {cluster}")
    return run()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    raise SystemExit(main())
