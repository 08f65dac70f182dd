"""Configuration: one frozen dataclass per service, read from ``TXMQ_*`` variables and flags.

A field ``check_interval_seconds`` is set by ``TXMQ_CHECK_INTERVAL_SECONDS`` or
``--check-interval-seconds``; a flag wins over the environment, the environment over the
default. Tuples are comma-separated lists. Units are in the field names.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from typing import Any, Mapping, Sequence, TypeVar

T = TypeVar("T")

ENV_PREFIX = "TXMQ_"


@dataclasses.dataclass(frozen=True)
class ServiceConfig:
    """Fields every service has."""

    host: str = "0.0.0.0"
    #: gRPC port; 0 binds an ephemeral port (tests).
    port: int = 0
    #: Prometheus /metrics port; 0 binds an ephemeral port, -1 disables the endpoint.
    metrics_port: int = 9400
    #: When set, a JSON file {"port", "metrics_port", "pid"} is written here once serving.
    ready_file: str = ""
    log_level: str = "INFO"
    #: On SIGTERM: stop accepting, let calls in flight finish this long, then cancel them.
    shutdown_grace_seconds: float = 5.0
    #: Largest gRPC message accepted (must exceed the largest body plus headers).
    max_grpc_message_bytes: int = 16 * 1024 * 1024


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def _parse(kind: Any, text: str, name: str) -> Any:
    origin = typing.get_origin(kind)
    if origin is tuple:
        (inner, *_rest) = typing.get_args(kind) or (str,)
        return tuple(_parse(inner, part.strip(), name) for part in text.split(",") if part.strip())
    if kind is bool:
        lowered = text.strip().lower()
        if lowered in {"1", "true", "yes", "on"}:
            return True
        if lowered in {"0", "false", "no", "off"}:
            return False
        raise ValueError(f"{name}: {text!r} is not a boolean (true/false)")
    if kind is int:
        return int(text)
    if kind is float:
        return float(text)
    return text


def load_config(cls: type[T], argv: Sequence[str] | None = None,
                env: Mapping[str, str] | None = None, **overrides: Any) -> T:
    """Builds ``cls`` from defaults, then ``env`` (``TXMQ_*``), then ``argv`` flags, then
    ``overrides``. Raises ``SystemExit`` (argparse) or ``ValueError`` naming the field."""
    env = os.environ if env is None else env
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    parser = argparse.ArgumentParser(prog=cls.__name__, description=cls.__doc__)
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        kind = hints[field.name]
        raw = env.get(env_name(field.name))
        if raw is not None:
            try:
                values[field.name] = _parse(kind, raw, env_name(field.name))
            except ValueError as exc:
                raise ValueError(f"{env_name(field.name)}={raw!r}: {exc}") from None
        parser.add_argument("--" + field.name.replace("_", "-"), dest=field.name, default=None,
                            help=f"env {env_name(field.name)} (default {field.default!r})")
    args = parser.parse_args(list(argv) if argv is not None else [])
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        raw = getattr(args, field.name)
        if raw is not None:
            try:
                values[field.name] = _parse(hints[field.name], raw, "--" + field.name.replace("_", "-"))
            except ValueError as exc:
                parser.error(str(exc))
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
