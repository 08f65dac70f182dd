"""Configuration: one frozen dataclass per service, read from ``TXMQ_*`` variables and flags.

A field ``check_interval_seconds`` is set by ``TXMQ_CHECK_INTERVAL_SECONDS`` or
``--check-interval-seconds``; a flag wins over the environment, the environment over the
default. Tuples are comma-separated lists. Units are in the field names.

What a field accepts is declared beside it, and every way of setting it is checked against
that declaration (the environment, flags, keyword arguments)::

    heartbeat_interval_seconds: float = seconds(10.0, max=HOUR)
    wal_prefill_bytes: int = nbytes(64 * MiB, min=0, max=64 * GiB, zero="off")
    replication_factor: int = count(1, max=16)

NaN and infinities never pass; a value outside ``min..max`` is refused unless it is one of
the field's documented special values (``zero="off"``, ``special={-1: "..."}``). A refusal is
a :class:`ConfigError` naming the field, where the value came from, the value and what is
allowed. A numeric field without a declaration fails tests/unit/test_config_ranges.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import math
import os
import re
import typing
from typing import Any, Callable, Mapping, Sequence, TypeVar

T = TypeVar("T")

ENV_PREFIX = "TXMQ_"

MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0
#: The longest duration any setting takes (366 days).
YEAR = 366 * DAY
#: The shortest interval or timeout: anything shorter is a busy loop, not a setting.
MIN_SECONDS = 0.001
KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
#: The most of anything one request or batch may carry (counts, batch sizes).
MAX_COUNT = 10_000
#: gRPC sizes are 32-bit signed.
MAX_GRPC_BYTES = 2**31 - 1
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

_METADATA_KEY = "txmq.accepts"


class ConfigError(ValueError):
    """A setting refused: ``field``, where its value came from (``source``: a ``TXMQ_*``
    variable, a ``--flag``, or both names when it was passed in code), the value as given,
    and what the field allows."""

    def __init__(self, field: str, source: str, value: Any, problem: str, allowed: str = "") -> None:
        shown = value if isinstance(value, str) else _show(value)
        text = f"{field}={shown!r} (from {source}): {problem}" if source else f"{field}={shown!r}: {problem}"
        if allowed:
            text += f"; allowed: {allowed}"
        super().__init__(text)
        self.field = field
        self.source = source
        self.value = value
        self.problem = problem
        self.allowed = allowed


@dataclasses.dataclass(frozen=True)
class Accepts:
    """What one field accepts. Numbers: ``min <= value <= max`` (both inclusive) or one of
    ``special`` (value → what it means). Strings: one of ``choices`` when given."""

    min: float | None = None
    max: float | None = None
    special: tuple[tuple[float, str], ...] = ()
    unit: str = ""
    choices: tuple[str, ...] = ()
    ignore_case: bool = False

    def meaning(self, value: Any) -> str | None:
        """What a special value means (None when it has no meaning of its own)."""
        for special, text in self.special:
            if value == special:
                return text
        return None

    def describe(self, kind: type = float) -> str:
        """The allowed values in one phrase: ``0.001..3600 seconds (0: off)``."""
        if self.choices:
            return "one of " + ", ".join(self.choices) + (" (any case)" if self.ignore_case else "")
        noun = "an integer" if kind is int else "a number"
        shown = _show_bytes if self.unit == "bytes" else _show
        text = f"{noun} {shown(self.min)}..{shown(self.max)}"
        if self.unit:
            text += f" {self.unit}"
        if self.special:
            text += " (" + ", ".join(f"{_show(v)}: {m}" for v, m in self.special) + ")"
        return text

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is refused, or None."""
        if self.choices:
            text = value.upper() if self.ignore_case and isinstance(value, str) else value
            return None if text in self.choices else "not one of the choices"
        if self.meaning(value) is not None:
            return None
        if isinstance(value, float) and not math.isfinite(value):
            return "not a finite number"
        if self.min is not None and value < self.min:
            return "below the minimum"
        if self.max is not None and value > self.max:
            return "above the maximum"
        return None

    def json_schema(self, kind: type) -> dict[str, Any]:
        """The same rule as JSON Schema (the chart's values.schema.json)."""
        if self.choices:
            return {"type": "string", "enum": list(self.choices)}
        schema: dict[str, Any] = {"type": "integer" if kind is int else "number"}
        if self.min is not None:
            schema["minimum"] = _json_number(self.min, kind)
        if self.max is not None:
            schema["maximum"] = _json_number(self.max, kind)
        outside = [v for v, _m in self.special if not (self.min is None or self.min <= v) or
                   not (self.max is None or v <= self.max)]
        if outside:
            return {"anyOf": [*({"const": _json_number(v, kind)} for v in outside), schema]}
        return schema


def _json_number(value: float, kind: type) -> int | float:
    return int(value) if kind is int or float(value).is_integer() else float(value)


def _show(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return str(value)


def _show_bytes(value: Any) -> str:
    """``4194304 (4 MiB)``: the exact number, and the binary unit when it is a round one."""
    for unit, scale in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if value and value % scale == 0:
            return f"{_show(value)} ({value // scale} {unit})"
    return _show(value)


def bounded(default: float, *, min: float, max: float, zero: str | None = None,
            special: Mapping[float, str] | None = None, unit: str = "") -> Any:
    """A numeric field accepting ``min..max`` (inclusive). ``zero`` says what 0 means: a
    range reaching 0 must say it (tests/unit/test_config_ranges.py checks). ``special``
    names values outside the range that mean something of their own (``{-1: "disabled"}``)."""
    meanings = dict(special or {})
    if zero is not None:
        meanings[0] = zero
    accepts = Accepts(min=min, max=max, special=tuple(sorted(meanings.items())), unit=unit)
    return dataclasses.field(default=default, metadata={_METADATA_KEY: accepts})


def seconds(default: float, *, min: float = MIN_SECONDS, max: float, zero: str | None = None) -> Any:
    """A duration in seconds: ``min`` (1 ms unless given) to ``max``."""
    return bounded(default, min=min, max=max, zero=zero, unit="seconds")


def nbytes(default: int, *, min: int = 1, max: int, zero: str | None = None) -> Any:
    """A size in bytes."""
    return bounded(default, min=min, max=max, zero=zero, unit="bytes")


def count(default: int, *, min: int = 1, max: int = MAX_COUNT, zero: str | None = None) -> Any:
    """A count (items, attempts, batch size)."""
    return bounded(default, min=min, max=max, zero=zero)


def tcp_port(default: int, *, zero: str | None = "an ephemeral port",
             special: Mapping[float, str] | None = None) -> Any:
    """A TCP port: 0..65535 (0 binds an ephemeral port unless ``zero=None``)."""
    return bounded(default, min=0 if zero is not None else 1, max=65535, zero=zero, special=special)


def choice(default: str, choices: Sequence[str], *, ignore_case: bool = False) -> Any:
    """A string that must be one of ``choices``."""
    return dataclasses.field(default=default, metadata={
        _METADATA_KEY: Accepts(choices=tuple(choices), ignore_case=ignore_case)})


def accepts_of(cls: type, name: str) -> Accepts | None:
    """The declaration of field ``name``; a subclass that only changes the default (``port:
    int = 10911``) keeps its base class's declaration."""
    for klass in cls.__mro__:
        field = getattr(klass, "__dataclass_fields__", {}).get(name)
        if field is not None and _METADATA_KEY in field.metadata:
            return field.metadata[_METADATA_KEY]
    return None


def is_numeric(kind: Any) -> bool:
    return kind in (int, float)


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def check_value(cls: type, name: str, kind: Any, value: Any, source: str) -> None:
    """Raises :class:`ConfigError` when field ``name`` of ``cls`` must not take ``value``."""
    accepts = accepts_of(cls, name)
    allowed = accepts.describe(kind) if accepts is not None else ""
    if is_numeric(kind):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(name, source, value, f"not {'an integer' if kind is int else 'a number'}", allowed)
        if kind is int and not isinstance(value, int):
            raise ConfigError(name, source, value, "not an integer", allowed)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(name, source, value, "not a finite number", allowed)
    if accepts is not None:
        problem = accepts.problem(value)
        if problem is not None:
            raise ConfigError(name, source, value, problem, allowed)


def check_fields(config: Any) -> None:
    """Checks every field of ``config`` against its declaration (ServiceConfig does this
    whenever one is built, so code that builds a configuration is held to the same rules)."""
    cls = type(config)
    hints = _hints(cls)
    for field in dataclasses.fields(config):
        check_value(cls, field.name, hints[field.name], getattr(config, field.name),
                    f"{env_name(field.name)} / {flag_name(field.name)}")


@dataclasses.dataclass(frozen=True)
class ServiceConfig:
    """Fields every service has."""

    #: Interface the gRPC, /metrics and health servers bind. Loopback unless configured
    #: (secure by default: a service started without settings is reachable from this host
    #: only); 0.0.0.0 for every interface (the chart sets it, with auth and TLS on).
    host: str = "127.0.0.1"
    #: gRPC port.
    port: int = tcp_port(0)
    #: Prometheus /metrics port.
    metrics_port: int = tcp_port(9400, special={-1: "no /metrics endpoint"})
    #: A second, plaintext gRPC port serving only grpc.health.v1 (Kubernetes' gRPC probes
    #: cannot speak TLS): for probes when the gRPC port serves TLS.
    health_port: int = tcp_port(-1, special={-1: "none (health is on the gRPC port only)"})
    #: When set, a JSON file {"port", "metrics_port", "pid"} is written here once serving.
    ready_file: str = ""
    #: Least severe log level written (JSON lines on stdout).
    log_level: str = choice("INFO", LOG_LEVELS, ignore_case=True)
    #: On SIGTERM: stop accepting, let calls in flight finish this long, then cancel them
    #: (at most what the service's stop steps leave of its 10 s: 3 s for a broker).
    shutdown_grace_seconds: float = seconds(5.0, min=0, max=HOUR, zero="calls in flight are cancelled at once")
    #: Largest gRPC message accepted (must exceed the largest body plus headers); at least
    #: gRPC's own default, 4 MiB.
    max_grpc_message_bytes: int = nbytes(16 * MiB, min=4 * MiB, max=MAX_GRPC_BYTES)
    #: TLS (services/common/tls.py): this service's certificate chain (PEM). Set: the gRPC
    #: port serves TLS only, and every channel this service opens to another (name servers,
    #: brokers, checkers, etcd at https://) is TLS presenting this certificate. Empty: plaintext.
    tls_cert_file: str = ""
    #: The private key of tls_cert_file (PEM).
    tls_key_file: str = ""
    #: The CAs (PEM bundle) this service trusts: for the certificates of the services it dials
    #: and, with tls_client_auth=require, of its clients. Empty: the system's roots.
    tls_ca_file: str = ""
    #: none: clients need no certificate; require: every client presents one signed by
    #: tls_ca_file (mutual TLS). The files are read again when they change (no restart).
    tls_client_auth: str = choice("none", ("none", "require"))
    #: The name the other services' certificates are checked against when it is not the host
    #: dialed (e.g. addresses are IPs). Empty: the host dialed.
    tls_server_name: str = ""
    #: Unary calls served at once; one more is refused at once with a retryable
    #: RESOURCE_EXHAUSTED (reason OVERLOADED, nothing applied) that clients back off on.
    max_concurrent_rpcs: int = count(2000, max=1_000_000)
    #: Calls gRPC queues before the service picks them up; beyond it gRPC itself cancels
    #: them (CANCELLED), so this is sized well above ``max_concurrent_rpcs``.
    max_pending_rpcs: int = count(20_000, min=100, max=1_000_000)
    #: Streams one connection may hold open (RESOURCE_EXHAUSTED naming this beyond).
    max_streams_per_connection: int = count(1000, max=1_000_000)
    #: Streams one principal may hold open here, all its connections together (auth on; a
    #: proxy's streams for a principal are that principal's, a service identity's own are not
    #: counted): more connections do not lift max_streams_per_connection for a tenant. Beyond,
    #: RESOURCE_EXHAUSTED (PRINCIPAL_LIMIT) naming this.
    max_streams_per_principal: int = count(5000, max=1_000_000)
    #: Unary calls of one principal in flight at once, all its connections together (auth on;
    #: counted as max_streams_per_principal): its share of max_concurrent_rpcs, so one tenant's
    #: slow calls cannot fill it for every other. Beyond, the retryable OVERLOADED naming this
    #: (nothing applied; the SDK and the proxy back off and retry).
    max_concurrent_rpcs_per_principal: int = count(1000, max=1_000_000)
    #: Credential files (principals, hashed tokens, access keys, ACL; see README "Security").
    #: Empty: no authentication, everything allowed (the embedded default of ``make run``);
    #: set: every call needs credentials and the ACL's permission (default deny).
    auth_files: tuple[str, ...] = ()
    #: This service's own bearer token (a file holding it), sent on its calls to the other
    #: services; empty with mTLS (the certificate is the identity) or with auth off.
    auth_token_file: str = ""
    #: How often the credential and token files are looked at for changes.
    auth_reload_seconds: float = seconds(1.0, max=HOUR)

    def __post_init__(self) -> None:
        check_fields(self)
        check_tls_settings(self)


def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


# Declared as a plain callable: the cache's own signature takes Hashable arguments, which
# mypy does not see a class as.
_hints: Callable[[type], dict[str, Any]] = functools.cache(_type_hints)


def _parse(kind: Any, text: str) -> Any:
    """``text`` as a ``kind``; ValueError says what it is not."""
    origin = typing.get_origin(kind)
    if origin is tuple:
        (inner, *_rest) = typing.get_args(kind) or (str,)
        return tuple(_parse(inner, part.strip()) for part in text.split(",") if part.strip())
    if kind is bool:
        lowered = text.strip().lower()
        if lowered in {"1", "true", "yes", "on"}:
            return True
        if lowered in {"0", "false", "no", "off"}:
            return False
        raise ValueError("not a boolean (true/false, 1/0, yes/no, on/off)")
    if kind is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError("not an integer") from None
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError("not a number") from None
    return text


def _read(cls: type, name: str, kind: Any, raw: str, source: str) -> Any:
    """The value ``raw`` (from ``source``) gives field ``name``, checked."""
    accepts = accepts_of(cls, name)
    base = typing.get_args(kind)[0] if typing.get_origin(kind) is tuple and typing.get_args(kind) else kind
    try:
        value = _parse(kind, raw)
    except ValueError as exc:
        raise ConfigError(name, source, raw, str(exc), accepts.describe(base) if accepts else "") from None
    try:
        for item in value if typing.get_origin(kind) is tuple else (value,):
            check_value(cls, name, base, item, source)
    except ConfigError as exc:
        raise ConfigError(name, source, raw, exc.problem, exc.allowed) from None  # the value as written
    return value


class _Parser(argparse.ArgumentParser):
    """Flag errors become a :class:`ValueError` (one line from ``run_main``), not argparse's
    usage text and exit."""

    def error(self, message: str) -> typing.NoReturn:
        raise ValueError(message)


def _read_field_docs(cls: type) -> dict[str, str]:
    """The ``#:`` comments above each field, from the source of ``cls`` and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            lines = inspect.getsource(klass).splitlines()
        except (OSError, TypeError):
            continue
        pending: list[str] = []
        for line in lines:
            comment = re.match(r"\s+#:\s?(.*)$", line)
            if comment:
                pending.append(comment.group(1).strip())
                continue
            assignment = re.match(r"\s+(\w+)\s*:", line)
            if assignment and pending:
                docs[assignment.group(1)] = " ".join(pending)
            pending = []
    return docs


field_docs: Callable[[type], dict[str, str]] = functools.cache(_read_field_docs)  # as _hints


def _help(cls: type, field: dataclasses.Field[Any], kind: Any, doc: str) -> str:
    accepts = accepts_of(cls, field.name)
    default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
    if isinstance(default, tuple):
        default = ",".join(map(str, default))
    parts = [f"{env_name(field.name)}"]
    if accepts is not None:
        parts.append(accepts.describe(kind))
    parts.append(f"default {default!r}" if isinstance(default, str) else f"default {_show(default)}")
    text = "; ".join(parts)
    if doc:
        text += ". " + doc
    return text.replace("%", "%%")


def _description(cls: type) -> str:
    doc = cls.__doc__ or ""
    if doc.startswith(cls.__name__ + "("):  # the signature dataclasses put there: say nothing
        module = inspect.getmodule(cls)
        doc = (module.__doc__ or "") if module is not None else ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _metavar(name: str, kind: Any) -> str:
    for suffix in ("seconds", "bytes"):
        if name.endswith("_" + suffix):
            return suffix.upper()
    if kind is bool:
        return "true|false"
    if typing.get_origin(kind) is tuple:
        return "A,B,..."
    return {int: "N", float: "X"}.get(kind, "TEXT")


def load_config(cls: type[T], argv: Sequence[str] | None = None,
                env: Mapping[str, str] | None = None, *, prog: str | None = None, **overrides: Any) -> T:
    """Builds ``cls`` from defaults, then ``env`` (``TXMQ_*``), then ``argv`` flags, then
    ``overrides``. Raises :class:`ConfigError` (a ``ValueError``) naming the field, its
    variable or flag, the value and what is allowed; ``--help`` prints each field's range
    and raises ``SystemExit(0)``."""
    env = os.environ if env is None else env
    hints = _hints(cls)
    values: dict[str, Any] = {}
    docs = field_docs(cls)
    parser = _Parser(prog=prog or cls.__name__, usage="%(prog)s [--setting VALUE ...]", description=_description(cls),
                     epilog="Each setting is also read from its TXMQ_* variable; a flag wins over the variable.")
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]  # a dataclass: T is not bound to one
        kind = hints[field.name]
        raw = env.get(env_name(field.name))
        if raw is not None:
            values[field.name] = _read(cls, field.name, kind, raw, env_name(field.name))
        parser.add_argument(flag_name(field.name), dest=field.name, default=None,
                            metavar=_metavar(field.name, kind),
                            help=_help(cls, field, kind, docs.get(field.name, "")))
    args = parser.parse_args(list(argv) if argv is not None else [])
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]  # a dataclass: T is not bound to one
        raw = getattr(args, field.name)
        if raw is not None:
            values[field.name] = _read(cls, field.name, hints[field.name], raw, flag_name(field.name))
    values.update(overrides)
    config = cls(**values)
    validate = getattr(config, "validate", None)
    if validate is not None:
        validate()
    return config


def config_env(config: Any) -> dict[str, str]:
    """The ``TXMQ_*`` environment that reproduces ``config`` (for starting a process)."""
    out = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if isinstance(value, tuple):
            value = ",".join(str(v) for v in value)
        elif isinstance(value, bool):
            value = "true" if value else "false"
        out[env_name(field.name)] = str(value)
    return out


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def check_tls_settings(config: Any) -> None:
    """Raises :class:`ConfigError` for settings that cannot work together or files that cannot
    be read (checked when the configuration is built, before anything is bound)."""
    def refuse(name: str, problem: str) -> ConfigError:
        return ConfigError(name, f"{env_name(name)} / {flag_name(name)}", getattr(config, name), problem)

    if bool(config.tls_cert_file) != bool(config.tls_key_file):
        name = "tls_key_file" if config.tls_cert_file else "tls_cert_file"
        raise refuse(name, "tls_cert_file and tls_key_file go together (both set, or neither)")
    if (config.tls_ca_file or config.tls_server_name) and not config.tls_cert_file:
        name = "tls_ca_file" if config.tls_ca_file else "tls_server_name"
        raise refuse(name, "TLS is on only with tls_cert_file and tls_key_file (this would be ignored)")
    if config.tls_client_auth == "require" and not (config.tls_cert_file and config.tls_ca_file):
        raise refuse("tls_client_auth", "require needs tls_cert_file, tls_key_file and tls_ca_file")
    for name in ("tls_cert_file", "tls_key_file", "tls_ca_file"):
        path = getattr(config, name)
        if path and not os.access(path, os.R_OK):
            raise refuse(name, "not a readable file")
