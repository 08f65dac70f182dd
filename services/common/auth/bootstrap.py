"""``python -m services.common.auth bootstrap``: the credential files of a real deployment,
and the Kubernetes Secrets that carry them (docs/security.md).

Into ``--out`` (which must be empty or new, so nothing is overwritten by mistake), each
file readable by its owner only (0600):

- ``credentials.yaml``: the principals — the four service identities (``service: true``,
  their tokens' digests and, for mutual TLS, the common names the chart's cert-manager
  certificates carry: ``<release>-<component>``), the administrator (``--admin``, ACL
  ``admin-read``/``admin-write`` on the cluster), each application (``--app``: a token, no
  rights until you add ACL rules) and each RocketMQ client (``--rocketmq-app``) — and the ACL;
- ``access-keys.yaml``: the RocketMQ clients' access keys with their HMAC secrets (the proxy
  alone mounts it);
- ``tokens/<principal>.token``: every token in clear, once (services read theirs from a
  Secret; give each application its own, then delete what you no longer need);
- ``secrets.yaml``: the Secrets, ``<release>-auth-credentials``, ``<release>-auth-access-keys``,
  ``<release>-<component>-token`` and ``<release>-admin-token`` (``kubectl apply -f``);
- ``values-auth.yaml``: the chart's values that mount them (``helm install -f``).

Tokens are 32 random bytes (``txmq_`` + URL-safe base64); the store keeps only their
SHA-256 digests. Access key secrets are 32 random bytes too.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
from pathlib import Path
from typing import Any, Sequence

import yaml

from .store import hash_token, parse

SERVICES = ("nameserver", "broker", "checker", "proxy")
#: A principal name that is also safe in a file and a Kubernetes object name.
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def new_token() -> str:
    return "txmq_" + secrets.token_urlsafe(32)


def _private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def _secret(name: str, namespace: str, data: dict[str, str], release: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/part-of": "txmq", "app.kubernetes.io/instance": release}},
            "stringData": data}


def bootstrap(out: Path, *, release: str = "txmq", namespace: str = "default", admin: str = "operator",
              apps: Sequence[str] = (), rocketmq_apps: Sequence[str] = ()) -> dict[str, str]:
    """Writes the files (see the module docstring); returns principal → token."""
    names = [admin, *apps, *rocketmq_apps]
    for name in [release, *names]:
        if not _NAME.match(name):
            raise ValueError(f"{name!r}: use lower-case letters, digits and '-' (a DNS label)")
    if len(set(names) | set(SERVICES)) != len(names) + len(SERVICES):
        raise ValueError("every principal needs a name of its own (the services are " + ", ".join(SERVICES) + ")")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out}: not empty; bootstrap never overwrites credentials (choose a new directory)")
    (out / "tokens").mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o700)
    os.chmod(out / "tokens", 0o700)

    tokens = {name: new_token() for name in (*SERVICES, admin, *apps)}
    principals: dict[str, Any] = {}
    for service in SERVICES:
        principals[service] = {"service": True, "tokens": [hash_token(tokens[service])],
                               "certificates": [f"{release}-{service}"]}
    for name in (admin, *apps):
        principals[name] = {"tokens": [hash_token(tokens[name])]}
    for name in rocketmq_apps:
        principals[name] = {}
    acl = [{"principal": admin, "resource": "cluster", "actions": ["admin-read", "admin-write"]}]
    credentials = {"principals": principals, "acl": acl}
    access_keys = {"access_keys": {f"AK-{name.upper()}-{secrets.token_hex(4).upper()}":
                                   {"principal": name, "secret": secrets.token_urlsafe(32)} for name in rocketmq_apps}}
    parse([("credentials.yaml", credentials), ("access-keys.yaml", access_keys)])  # what the services will load

    header = ("# txmq credentials (python -m services.common.auth bootstrap). Add ACL rules for the\n"
              "# applications, e.g.\n"
              "#   - {principal: orders-app, resource: \"topic:orders\", actions: [publish]}\n"
              "#   - {principal: orders-app, resource: \"producer_group:orders\", actions: [check]}\n"
              "# Tokens are stored as SHA-256 digests only; docs/security.md.\n")
    credentials_text = header + yaml.safe_dump(credentials, sort_keys=False)
    access_keys_text = yaml.safe_dump(access_keys, sort_keys=False)
    _private(out / "credentials.yaml", credentials_text)
    _private(out / "access-keys.yaml", access_keys_text)
    for name, token in tokens.items():
        _private(out / "tokens" / f"{name}.token", token + "\n")

    docs = [_secret(f"{release}-auth-credentials", namespace, {"credentials.yaml": credentials_text}, release),
            _secret(f"{release}-auth-access-keys", namespace, {"access-keys.yaml": access_keys_text}, release),
            *(_secret(f"{release}-{s}-token", namespace, {"token": tokens[s]}, release) for s in SERVICES),
            _secret(f"{release}-admin-token", namespace, {"token": tokens[admin]}, release)]
    _private(out / "secrets.yaml", yaml.safe_dump_all(docs, sort_keys=False))
    values = {"auth": {"enabled": True,
                       "credentials": {"secretName": f"{release}-auth-credentials", "key": "credentials.yaml"},
                       "accessKeys": {"secretName": f"{release}-auth-access-keys", "key": "access-keys.yaml"},
                       "serviceTokens": {"key": "token",
                                         "secretNames": {s: f"{release}-{s}-token" for s in SERVICES}}}}
    _private(out / "values-auth.yaml", yaml.safe_dump(values, sort_keys=False))
    return tokens


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.common.auth bootstrap",
                                     description="Credential files and Kubernetes Secrets for a txmq deployment.")
    parser.add_argument("--out", required=True, type=Path, help="a new (or empty) directory for the files")
    parser.add_argument("--release", default="txmq", help="the Helm release name (names the Secrets; default txmq)")
    parser.add_argument("--namespace", default="default", help="the namespace of the Secrets (default default)")
    parser.add_argument("--admin", default="operator", help="the administrator principal (default operator)")
    parser.add_argument("--app", action="append", default=[], help="an application principal with a token (repeatable)")
    parser.add_argument("--rocketmq-app", action="append", default=[],
                        help="a RocketMQ client principal with an access key (repeatable)")
    args = parser.parse_args(argv)
    try:
        bootstrap(args.out, release=args.release, namespace=args.namespace, admin=args.admin, apps=args.app,
                  rocketmq_apps=args.rocketmq_app)
    except (ValueError, OSError) as exc:
        parser.exit(2, f"bootstrap: {exc}\n")
    print(f"wrote {args.out}/: credentials.yaml, access-keys.yaml, tokens/, secrets.yaml, values-auth.yaml\n"
          f"  kubectl apply -n {args.namespace} -f {args.out}/secrets.yaml\n"
          f"  helm install {args.release} deploy/helm/txmq -n {args.namespace} -f {args.out}/values-auth.yaml\n"
          f"  the administrator's token: {args.out}/tokens/{args.admin}.token (TXMQ_TOKEN for the txmq CLI)")
    return 0
