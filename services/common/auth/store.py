"""The credential store the operator manages: principals, their credentials and the ACL,
read from YAML (or JSON) files — in Kubernetes, Secrets mounted as files — and read again
when a file changes, without a restart.

One file or several (merged: principals by name, rules and access keys added up); the chart
mounts the tokens and the ACL into every service and the access keys (which hold HMAC
secrets) into the proxy only::

    principals:
      orders-app:
        tokens: ["sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"]
      broker:
        service: true                       # a service identity: the internal role
        tokens: ["sha256:..."]
        certificates: ["broker.txmq.svc"]   # mTLS: certificate common name or SAN
    access_keys:                            # RocketMQ clients' signed requests (proxy)
      AK-ORDERS: {principal: orders-app, secret: "..."}
      AK-PY-SH: {principal: orders-app, secret: "...", time_zone: Asia/Shanghai}   # see below
    acl:
      - {principal: orders-app, resource: "topic:orders", actions: [publish]}
      - {principal: orders-app, resource: "producer_group:orders-*", actions: [check]}
      - {principal: staging-app, namespace: staging, resource: cluster, actions: [publish, subscribe]}

Tokens are stored only as ``sha256:<hex>`` digests: a token is 32 random bytes
(``python -m services.common.auth new-token``), so a fast hash is as safe as a slow one and
lookup stays one dictionary access per call. HMAC needs the access key's secret itself:
it lives in its own file, mounted into the proxy alone, readable only by its user.

A signed request carries only a signature over its ``x-mq-date-time`` stamp, so the proxy
refuses a stamp further than ``signature_max_skew_seconds`` from its clock (a replay). The
stamp is meant to be UTC, and the Node.js client sends UTC; the official Python client (5.x,
``rocketmq.v5.util.signature``: ``datetime.now()``) and Java client (``Signature.sign``: a
``SimpleDateFormat`` in the JVM's default zone) format their host's *local* time and label
it ``Z``. An access key used by such clients on hosts outside UTC therefore names their
zone, ``time_zone`` (an IANA name, which needs the system's time zone database, or a fixed
offset ``+08:00``): its stamps are read as local times of that zone. Default UTC.

A file that fails to parse is refused whole: at start-up the service does not start; on a
reload the previous store stays in force and the error is logged (once per change).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import hmac
import json
import logging
import os
import threading
import time
import zoneinfo
from typing import Any, Callable, Iterable, Mapping

import yaml

from txmq.errors import TxmqError
from txmq.names import validate_namespace

from .acl import ACTIONS, Rule, parse_resource

log = logging.getLogger(__name__)

TOKEN_HASH_PREFIX = "sha256:"


class CredentialsError(ValueError):
    """A credential file that cannot be used; the message names the file and the entry."""


def hash_token(token: str) -> str:
    """What the store keeps of a token: ``sha256:<hex>``."""
    return TOKEN_HASH_PREFIX + hashlib.sha256(token.encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class Principal:
    name: str
    #: A service identity (broker, checker, proxy, name server): the internal role.
    service: bool = False


@dataclasses.dataclass(frozen=True)
class AccessKey:
    principal: str
    secret: str
    #: The zone whose local time this key's clients stamp in x-mq-date-time (UTC, but the
    #: official Python and Java clients stamp their host's local time: see the module docstring).
    time_zone: datetime.tzinfo = datetime.timezone.utc


def parse_time_zone(text: str) -> datetime.tzinfo:
    """``UTC``, a fixed offset ``+08:00`` / ``-05:30``, or an IANA name (``Asia/Shanghai``);
    raises ValueError."""
    if text.upper() in ("UTC", "Z"):
        return datetime.timezone.utc
    if text[:1] in "+-" and len(text) == 6 and text[3] == ":" and text[1:3].isdigit() and text[4:].isdigit():
        minutes = int(text[1:3]) * 60 + int(text[4:])
        if minutes > 14 * 60:
            raise ValueError(f"offset {text!r} is beyond ±14:00")
        return datetime.timezone(datetime.timedelta(minutes=minutes if text[0] == "+" else -minutes))
    try:
        return zoneinfo.ZoneInfo(text)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"{text!r} is not UTC, an offset like +08:00, or a zone this system's time zone "
                         "database knows") from exc


@dataclasses.dataclass(frozen=True)
class Credentials:
    """One consistent snapshot of the files: lookups never see half a reload."""

    principals: Mapping[str, Principal]
    by_token_hash: Mapping[str, str]
    by_certificate_name: Mapping[str, str]
    access_keys: Mapping[str, AccessKey]
    rules: tuple[Rule, ...]

    def principal_for_token(self, token: str) -> Principal | None:
        name = self.by_token_hash.get(hash_token(token))
        return self.principals[name] if name is not None else None

    def principal_for_certificate(self, names: Iterable[str]) -> Principal | None:
        for name in names:
            principal = self.by_certificate_name.get(name)
            if principal is not None:
                return self.principals[principal]
        return None

    def principal_for_signature(self, access_key: str, signed: str, signature: str) -> Principal | None:
        """The principal of ``access_key`` when ``signature`` is the hex HMAC-SHA1 of
        ``signed`` under its secret (RocketMQ's MQv2-HMAC-SHA1)."""
        key = self.access_keys.get(access_key)
        if key is None:
            return None
        expected = hmac.new(key.secret.encode(), signed.encode(), hashlib.sha1).hexdigest()
        if not hmac.compare_digest(expected, signature.lower()):
            return None
        return self.principals[key.principal]


def _entries(data: Any, key: str, kind: type, where: str) -> Any:
    value = data.get(key)
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise CredentialsError(f"{where}: {key} must be a {'mapping' if kind is dict else 'list'}")
    return value


def _strings(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise CredentialsError(f"{where}: must be a list of non-empty strings")
    return value


def parse(documents: Iterable[tuple[str, Any]]) -> Credentials:
    """Builds one snapshot from parsed files ``(path, data)``; raises CredentialsError."""
    principals: dict[str, Principal] = {}
    tokens: dict[str, str] = {}
    certificates: dict[str, str] = {}
    access_keys: dict[str, AccessKey] = {}
    raw_rules: list[tuple[str, Any]] = []
    for path, data in documents:
        if data is None:
            continue
        if not isinstance(data, dict):
            raise CredentialsError(f"{path}: the top level must be a mapping")
        unknown = set(data) - {"principals", "access_keys", "acl"}
        if unknown:
            raise CredentialsError(f"{path}: unknown section(s) {sorted(unknown)}; "
                                   "allowed: principals, access_keys, acl")
        for name, entry in _entries(data, "principals", dict, path).items():
            where = f"{path}: principals.{name}"
            entry = entry or {}
            if not isinstance(name, str) or not name or not isinstance(entry, dict):
                raise CredentialsError(f"{where}: a principal is a name and a mapping")
            unknown = set(entry) - {"service", "tokens", "certificates"}
            if unknown:
                raise CredentialsError(f"{where}: unknown field(s) {sorted(unknown)}")
            service = entry.get("service", False)
            if not isinstance(service, bool):
                raise CredentialsError(f"{where}.service: must be true or false")
            previous = principals.get(name)
            principals[name] = Principal(name, service or (previous.service if previous else False))
            for digest in _strings(entry.get("tokens"), f"{where}.tokens"):
                hexpart = digest.removeprefix(TOKEN_HASH_PREFIX)
                if not digest.startswith(TOKEN_HASH_PREFIX) or len(hexpart) != 64 or \
                        any(c not in "0123456789abcdef" for c in hexpart):
                    raise CredentialsError(f"{where}.tokens: {digest[:12]}... is not a sha256:<64 hex> digest "
                                           "(tokens are stored hashed: python -m services.common.auth hash-token)")
                if tokens.get(digest, name) != name:
                    raise CredentialsError(f"{where}.tokens: the same token is also {tokens[digest]!r}'s")
                tokens[digest] = name
            for cert_name in _strings(entry.get("certificates"), f"{where}.certificates"):
                if certificates.get(cert_name, name) != name:
                    raise CredentialsError(f"{where}.certificates: {cert_name!r} is also {certificates[cert_name]!r}'s")
                certificates[cert_name] = name
        for key_id, entry in _entries(data, "access_keys", dict, path).items():
            where = f"{path}: access_keys.{key_id}"
            if not isinstance(entry, dict) or not isinstance(entry.get("principal"), str) or \
                    not isinstance(entry.get("secret"), str) or not entry["secret"]:
                raise CredentialsError(f"{where}: needs principal and a non-empty secret")
            unknown = set(entry) - {"principal", "secret", "time_zone"}
            if unknown:
                raise CredentialsError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: principal, secret, "
                                       "time_zone")
            zone = entry.get("time_zone", "UTC")
            try:
                tz = parse_time_zone(zone if isinstance(zone, str) else "")
            except ValueError as exc:
                raise CredentialsError(f"{where}.time_zone: {exc}") from None
            access_keys[str(key_id)] = AccessKey(entry["principal"], entry["secret"], tz)
        raw_rules.extend((path, r) for r in _entries(data, "acl", list, path))
    for key_id, key in access_keys.items():
        if key.principal not in principals:
            raise CredentialsError(f"access_keys.{key_id}: principal {key.principal!r} is not declared")
    rules = []
    for index, (path, raw) in enumerate(raw_rules):
        where = f"{path}: acl[{index}]"
        if not isinstance(raw, dict) or not {"principal", "resource", "actions"} <= set(raw) <= {
                "principal", "resource", "actions", "namespace"}:
            raise CredentialsError(f"{where}: a rule is {{principal, resource, actions}} and optionally namespace")
        namespace = raw.get("namespace")
        if namespace is not None:
            if not isinstance(namespace, str):
                raise CredentialsError(f"{where}.namespace: a namespace is a string")
            try:
                validate_namespace(namespace)
            except TxmqError as exc:
                raise CredentialsError(f"{where}.namespace: {exc.message}") from None
        if raw["principal"] not in principals:
            raise CredentialsError(f"{where}: principal {raw['principal']!r} is not declared")
        actions = _strings(raw["actions"], f"{where}.actions")
        bad = [a for a in actions if a not in ACTIONS]
        if bad or not actions:
            raise CredentialsError(f"{where}.actions: {bad or 'none'}; allowed: {', '.join(ACTIONS)}")
        try:
            resource = parse_resource(raw["resource"])
        except ValueError as exc:
            raise CredentialsError(f"{where}.resource: {exc}") from None
        rules.append(Rule(raw["principal"], resource, frozenset(actions), namespace))
    return Credentials(principals, tokens, certificates, access_keys, tuple(rules))


def _read(path: str) -> Any:
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    try:
        return json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise CredentialsError(f"{path}: not valid {'JSON' if path.endswith('.json') else 'YAML'}: "
                               f"{str(exc).splitlines()[0]}") from None


def _signature(path: str) -> tuple[int, int, int]:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return (0, 0, 0)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class CredentialStore:
    """The files' current snapshot; :meth:`current` looks at the files at most every
    ``reload_seconds`` and reloads them when one changed (a Kubernetes Secret update swaps
    the mounted files)."""

    def __init__(self, paths: Iterable[str], reload_seconds: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.paths = tuple(paths)
        self.reload_seconds = reload_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._signatures = tuple(_signature(p) for p in self.paths)
        self._credentials = self._load()  # raises: a service does not start on a bad file
        self._checked = clock()
        self._failed_signatures: tuple[tuple[int, int, int], ...] | None = None
        #: Successful reloads so far.
        self.reloads = 0

    def _load(self) -> Credentials:
        documents = []
        for path in self.paths:
            try:
                documents.append((path, _read(path)))
            except OSError as exc:
                raise CredentialsError(f"{path}: {exc.strerror or exc}") from None
        return parse(documents)

    def current(self) -> Credentials:
        now = self._clock()
        if now - self._checked < self.reload_seconds:
            return self._credentials
        with self._lock:
            if now - self._checked >= self.reload_seconds:
                self._checked = now
                self._maybe_reload()
        return self._credentials

    def _maybe_reload(self) -> None:
        signatures = tuple(_signature(p) for p in self.paths)
        if signatures == self._signatures or signatures == self._failed_signatures:
            return
        try:
            credentials = self._load()
        except CredentialsError as exc:
            self._failed_signatures = signatures
            log.error("credential files not reloaded, the previous ones stay in force",
                      extra={"fields": {"error": str(exc)}})
            return
        self._credentials, self._signatures, self._failed_signatures = credentials, signatures, None
        self.reloads += 1
        log.info("credential files reloaded", extra={"fields": {
            "principals": len(credentials.principals), "rules": len(credentials.rules),
            "access_keys": len(credentials.access_keys)}})
