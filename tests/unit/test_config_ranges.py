"""Every numeric setting of every service, tried with the values an operator's typo gives
(NaN, infinities, negatives, zero, huge numbers, ports outside 0..65535), through the
environment and through flags: each is refused with a message naming the field, its
variable or flag and what is allowed, or is a value the field documents (``zero="off"``).

A new numeric field is covered as soon as it is added; one without a declaration of what it
accepts fails ``test_every_numeric_setting_declares_what_it_accepts`` saying what to write."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest

from services.broker.config import BrokerConfig
from services.checker.config import CheckerConfig
from services.common.config import (HOUR, ConfigError, ServiceConfig, accepts_of, bounded, env_name,
                                    flag_name, load_config, seconds)
from services.nameserver.config import NameServerConfig
from services.proxy.config import ProxyConfig

SERVICES: dict[str, type] = {"broker": BrokerConfig, "checker": CheckerConfig, "nameserver": NameServerConfig,
                             "proxy": ProxyConfig}
#: What a service needs besides defaults to load at all (the proxy wants a name server).
BASE_ENV = {"TXMQ_NAMESERVER_ADDRESSES": "127.0.0.1:1"}

FLOAT_BAD = ["nan", "NaN", "inf", "-inf", "Infinity", "-1", "-0.001", "-1e300", "0", "1e20", "1e300"]
INT_BAD = ["-1", "-5", "0", "nan", "inf", "1.5", "1e300", str(10**30), str(2**63), str(2**64), "-" + str(2**63)]
PORT_BAD = ["-5", "65536", "70000", "99999"]


def numeric_fields(cls: type) -> list[tuple[str, type]]:
    hints = typing.get_type_hints(cls)
    return [(f.name, hints[f.name]) for f in dataclasses.fields(cls) if hints[f.name] in (int, float)]


def bad_values(name: str, kind: type) -> list[str]:
    values = list(FLOAT_BAD if kind is float else INT_BAD)
    if name.endswith("port"):
        values += PORT_BAD
    return values


def test_every_numeric_setting_declares_what_it_accepts() -> None:
    missing = [f"{cls.__name__}.{name}" for cls in SERVICES.values() for name, _kind in numeric_fields(cls)
               if accepts_of(cls, name) is None]
    assert not missing, (
        f"{', '.join(missing)}: no declaration of what the setting accepts. Declare it beside the field with a "
        "helper of services.common.config, e.g. `lease_seconds: float = seconds(10.0, max=HOUR)`, "
        "`replication_factor: int = count(3, max=16)`, `x_bytes: int = nbytes(64 * MiB, min=0, max=GiB, "
        "zero=\"off\")`, or `bounded(default, min=..., max=..., zero=\"what 0 means\")`; then run "
        "`python -m tools.chart_schema` if the chart sets it.")


def test_every_declared_special_value_says_what_it_means() -> None:
    """An accepted 0 or negative is a documented choice: a range reaching 0 says what 0 means."""
    undocumented = []
    for cls in SERVICES.values():
        for name, _kind in numeric_fields(cls):
            accepts = accepts_of(cls, name)
            if accepts is not None and accepts.min is not None and accepts.min <= 0 and accepts.meaning(0) is None:
                undocumented.append(f"{cls.__name__}.{name}")
    assert not undocumented, f"{undocumented}: 0 is accepted but its meaning is not declared (zero=\"...\")"


def test_every_bad_value_of_every_numeric_setting_is_refused_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    tried = 0
    accepted: list[str] = []
    unnamed: list[str] = []
    documented: list[str] = []
    for service, cls in SERVICES.items():
        for name, kind in numeric_fields(cls):
            accepts = accepts_of(cls, name)
            for raw in bad_values(name, kind):
                for source, argv, env in ((env_name(name), [], {**BASE_ENV, env_name(name): raw}),
                                          (flag_name(name), [f"{flag_name(name)}={raw}"], BASE_ENV)):
                    tried += 1
                    try:
                        config = load_config(cls, argv, env=env)
                    except ValueError as exc:
                        text = str(exc)
                        if name not in text or source not in text or "\n" in text:
                            unnamed.append(f"{service} {source}={raw}: {text!r}")
                        continue
                    value = getattr(config, name)
                    meaning = accepts.meaning(value) if accepts is not None else None
                    if meaning is None:
                        accepted.append(f"{service} {source}={raw} -> {value!r}")
                    elif f"{service}.{name}={raw} ({meaning})" not in documented:
                        documented.append(f"{service}.{name}={raw} ({meaning})")
    with capsys.disabled():
        print(f"\n{tried} bad values tried, {len(accepted)} accepted "
              f"(besides {len(documented)} values the fields document, accepted as documented: "
              f"{', '.join(documented)})")
    assert not accepted, f"accepted without a documented meaning: {accepted}"
    assert not unnamed, f"refused without naming the field and its source in one line: {unnamed}"
    assert tried > 1000


def test_a_refusal_names_field_source_value_and_range() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(BrokerConfig, [], env={"TXMQ_PORT": "99999"})
    assert str(info.value) == ("port='99999' (from TXMQ_PORT): above the maximum; "
                               "allowed: an integer 0..65535 (0: an ephemeral port)")
    assert (info.value.field, info.value.source) == ("port", "TXMQ_PORT")
    with pytest.raises(ConfigError, match=r"check_interval_seconds='1e300' \(from --check-interval-seconds\): "
                                          r"above the maximum; allowed: a number 0.001..86400 seconds"):
        load_config(BrokerConfig, ["--check-interval-seconds", "1e300"], env={})


def test_values_set_in_code_are_held_to_the_same_ranges() -> None:
    with pytest.raises(ConfigError, match=r"heartbeat_interval_seconds=.*TXMQ_HEARTBEAT_INTERVAL_SECONDS"):
        NameServerConfig(heartbeat_interval_seconds=0.0)
    with pytest.raises(ConfigError, match="check_jitter"):
        dataclasses.replace(BrokerConfig(), check_jitter=math.nan)
    with pytest.raises(ConfigError, match="not an integer"):
        CheckerConfig(claim_batch=2.5)  # type: ignore[arg-type]


def test_documented_values_in_and_outside_the_range_are_accepted() -> None:
    config = load_config(BrokerConfig, [], env={"TXMQ_METRICS_PORT": "-1", "TXMQ_WAL_PREFILL_BYTES": "0",
                                                "TXMQ_PORT": "0", "TXMQ_LOG_LEVEL": "debug"})
    assert (config.metrics_port, config.wal_prefill_bytes, config.port, config.log_level) == (-1, 0, 0, "debug")


def test_a_subclass_changing_a_default_keeps_the_base_declaration() -> None:
    assert accepts_of(BrokerConfig, "port") is accepts_of(ServiceConfig, "port")
    assert BrokerConfig().port == 10911


@dataclasses.dataclass(frozen=True)
class NewFieldsConfig(ServiceConfig):
    """What a service adding settings writes (and what the walking test then covers)."""

    #: How long a replica may lag.
    lag_seconds: float = seconds(2.0, max=HOUR)
    #: Copies of each record (1: no replication).
    replication_factor: int = bounded(3, min=1, max=16)


def test_a_new_declared_field_is_enforced_and_shown_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=r"replication_factor='17' \(from TXMQ_REPLICATION_FACTOR\)"):
        load_config(NewFieldsConfig, [], env={"TXMQ_REPLICATION_FACTOR": "17"})
    with pytest.raises(SystemExit) as info:
        load_config(NewFieldsConfig, ["--help"], env={}, prog="python -m services.example")
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--replication-factor N TXMQ_REPLICATION_FACTOR; an integer 1..16; default 3. Copies of each record" \
        in text
    assert "--lag-seconds SECONDS TXMQ_LAG_SECONDS; a number 0.001..3600 seconds; default 2. How long" in text


def test_help_of_a_service_shows_every_range(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load_config(BrokerConfig, ["--help"], env={})
    text = " ".join(capsys.readouterr().out.split())
    for name, kind in numeric_fields(BrokerConfig):
        accepts = accepts_of(BrokerConfig, name)
        assert accepts is not None and " ".join(accepts.describe(kind).split()) in text, name
    assert "--min-free-disk-bytes BYTES TXMQ_MIN_FREE_DISK_BYTES; an integer 0..9223372036854775807 bytes " \
           "(0: sends are never refused for disk space); default 536870912. Sends are refused" in text
