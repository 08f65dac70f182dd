"""Makes the compose quick start's credentials once (auth.yaml runs it as the one-shot
auth-init): a token per service and for the admin, the admin's RocketMQ access key, and the
files the services read (services/common/auth/store.py's format). Files that exist are kept,
so restarts and upgrades keep every credential."""

from __future__ import annotations

import hashlib
import os
import secrets
import sys
from pathlib import Path

import yaml

SERVICES = ("nameserver", "broker", "checker", "proxy")
UID = 10001  # the images' user


def _write(path: Path, text: str, mode: int, owner: int = UID) -> None:
    path.write_text(text)
    os.chown(path, owner, owner)
    os.chmod(path, mode)


def _token(directory: Path, name: str, mode: int) -> str:
    path = directory / f"{name}.token"
    if not path.exists():
        _write(path, "txmq_" + secrets.token_urlsafe(32) + "\n", mode)
    return path.read_text().strip()


def main(directory: Path) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    tokens = {name: _token(directory, name, 0o600) for name in SERVICES}
    # The admin's credentials are for you (readable on this host: keep the directory private
    # on a shared one).
    admin = _token(directory, "admin", 0o644)
    keys = directory / "admin.access-key"
    if not keys.exists():
        _write(keys, f"AK{secrets.token_hex(9).upper()} {secrets.token_urlsafe(30)}\n", 0o644)
    access_key, secret = keys.read_text().split()

    def digest(token: str) -> str:
        return "sha256:" + hashlib.sha256(token.encode()).hexdigest()

    credentials = directory / "credentials.yaml"
    if not credentials.exists():
        principals = {name: {"service": True, "tokens": [digest(t)]} for name, t in tokens.items()}
        principals["admin"] = {"tokens": [digest(admin)]}
        acl = [{"principal": "admin", "resource": "cluster",
                "actions": ["publish", "subscribe", "check", "admin-read", "admin-write"]}]
        _write(credentials, "# Principals (tokens as sha256 digests) and the ACL: add your applications'.\n"
               + yaml.safe_dump({"principals": principals, "acl": acl}, sort_keys=False), 0o640)
    access = directory / "access-keys.yaml"
    if not access.exists():
        _write(access, yaml.safe_dump({"access_keys": {access_key: {"principal": "admin", "secret": secret}}}),
               0o600)
    print(f"auth-init: credentials in {directory} (admin token: admin.token, access key: admin.access-key)")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
