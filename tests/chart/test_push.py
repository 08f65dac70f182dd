"""`make push REGISTRY=...` for real: the built images pushed by tools/images.sh into a
registry (Debian's docker-registry, the CNCF distribution registry, on a loopback port of
its own: `make registry-tools`) from the engine that built them, then read back through the
registry's API — the names the chart pulls with global.imageRegistry set to it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.waiting import wait_until

from .chart import COMPONENTS, REPO, render
from .test_images import PRIVATE_SOCKET, VERSION, inspected  # noqa: F401 - the images must be built


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.fail("docker-registry is not installed: run `make registry-tools` (apt-get install docker-registry)")
    with socket.socket() as s:  # a port the kernel hands out, given to the registry
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "registry.yml"
    config.write_text(f"version: 0.1\nlog: {{level: warn}}\nstorage: {{filesystem: {{rootdirectory: {tmp_path / 'data'}}}}}\n"
                      f"http: {{addr: 127.0.0.1:{port}}}\n")
    log = open(tmp_path / "registry.log", "wb")
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, (tmp_path / "registry.log").read_text()
        try:
            with urllib.request.urlopen(f"http://{address}/v2/", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False
    try:
        wait_until(up, timeout=30, interval=0.1, message="the registry did not answer")
        yield address
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


@pytest.mark.timeout(900)  # four images through make and the registry
def test_make_push_puts_every_image_where_the_chart_pulls_it(registry: str, inspected, helm_bin: Path) -> None:
    prefix = f"{registry}/acme"
    env = {**os.environ, "DOCKER_HOST": os.environ.get("DOCKER_HOST", PRIVATE_SOCKET)}
    try:
        out = subprocess.run(["make", "push", f"REGISTRY={prefix}"], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=600)
    finally:  # the engine is shared: leave it only the tags it had
        docker = "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else "docker"
        subprocess.run([docker, "rmi", *(f"{prefix}/txmq/{c}:{VERSION}" for c in COMPONENTS)], env=env,
                       capture_output=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"--set global.imageRegistry={prefix}" in out.stderr
    chart = render(helm_bin, sets={"global.imageRegistry": prefix})
    for component in COMPONENTS:
        image = chart.workload(component)["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image == f"{prefix}/txmq/{component}:{VERSION}"
        repository = image.split("/", 1)[1].rsplit(":", 1)[0]
        with urllib.request.urlopen(f"http://{registry}/v2/{repository}/tags/list", timeout=10) as r:
            assert json.load(r)["tags"] == [VERSION], component
    # Without a registry it says what to give it.
    missing = subprocess.run(["make", "push"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and "make push needs REGISTRY=" in missing.stderr
