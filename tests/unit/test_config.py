"""services/common/config.py: defaults < TXMQ_* environment < --flags < overrides."""

from __future__ import annotations

import dataclasses

import pytest

from services.broker.config import BrokerConfig
from services.common.config import ServiceConfig, config_env, env_name, field_names, load_config


@dataclasses.dataclass(frozen=True)
class SampleConfig(ServiceConfig):
    addresses: tuple[str, ...] = ()
    ports: tuple[int, ...] = ()
    enabled: bool = False
    interval_seconds: float = 30.0
    count: int = 16
    name: str = "default"


def test_env_name_is_prefix_plus_upper_case_field():
    assert env_name("check_interval_seconds") == "TXMQ_CHECK_INTERVAL_SECONDS"


def test_defaults_when_nothing_is_set():
    config = load_config(SampleConfig, [], env={})
    assert config == SampleConfig()
    assert config.port == 0 and config.metrics_port == 9400


def test_environment_overrides_defaults_with_types():
    config = load_config(SampleConfig, [], env={
        "TXMQ_INTERVAL_SECONDS": "0.25", "TXMQ_COUNT": "4", "TXMQ_NAME": "n1", "TXMQ_PORT": "1234",
    })
    assert config.interval_seconds == 0.25 and isinstance(config.interval_seconds, float)
    assert config.count == 4 and isinstance(config.count, int)
    assert config.name == "n1"
    assert config.port == 1234


def test_variables_without_the_prefix_or_for_no_field_are_ignored():
    config = load_config(SampleConfig, [], env={"COUNT": "3", "TXMQ_NO_SUCH_FIELD": "x"})
    assert config.count == 16


def test_flag_wins_over_environment():
    config = load_config(SampleConfig, ["--interval-seconds", "2.5", "--count=7"],
                         env={"TXMQ_INTERVAL_SECONDS": "0.25", "TXMQ_COUNT": "4", "TXMQ_NAME": "from-env"})
    assert config.interval_seconds == 2.5
    assert config.count == 7
    assert config.name == "from-env"  # not given as a flag: the environment still applies


def test_overrides_win_over_flags():
    config = load_config(SampleConfig, ["--count", "7"], env={"TXMQ_COUNT": "4"}, count=9)
    assert config.count == 9


def test_tuples_are_comma_separated_trimmed_and_typed():
    config = load_config(SampleConfig, [], env={
        "TXMQ_ADDRESSES": " 10.0.0.1:9876 , ns-1:9876,,", "TXMQ_PORTS": "1,2, 3",
    })
    assert config.addresses == ("10.0.0.1:9876", "ns-1:9876")
    assert config.ports == (1, 2, 3)


def test_empty_tuple_variable_gives_an_empty_tuple():
    assert load_config(SampleConfig, [], env={"TXMQ_ADDRESSES": ""}).addresses == ()


def test_tuple_flag():
    config = load_config(SampleConfig, ["--addresses", "a:1,b:2"], env={"TXMQ_ADDRESSES": "c:3"})
    assert config.addresses == ("a:1", "b:2")


@pytest.mark.parametrize("text", ["1", "true", "TRUE", "yes", "on", " True "])
def test_true_spellings(text):
    assert load_config(SampleConfig, [], env={"TXMQ_ENABLED": text}).enabled is True


@pytest.mark.parametrize("text", ["0", "false", "False", "no", "off"])
def test_false_spellings(text):
    assert load_config(SampleConfig, [], env={"TXMQ_ENABLED": text}).enabled is False


def test_bad_boolean_in_environment_names_the_variable_and_value():
    with pytest.raises(ValueError) as info:
        load_config(SampleConfig, [], env={"TXMQ_ENABLED": "maybe"})
    assert "TXMQ_ENABLED" in str(info.value)
    assert "maybe" in str(info.value)


def test_bad_number_in_environment_names_the_variable():
    with pytest.raises(ValueError) as info:
        load_config(SampleConfig, [], env={"TXMQ_COUNT": "four"})
    assert "TXMQ_COUNT" in str(info.value)


def test_bad_boolean_flag_is_refused_naming_the_flag(capsys):
    # A ValueError like the environment's (run_main turns it into one line and exit status 2),
    # not argparse's usage text.
    with pytest.raises(ValueError, match="--enabled") as info:
        load_config(SampleConfig, ["--enabled", "maybe"], env={})
    assert "enabled='maybe'" in str(info.value)
    assert capsys.readouterr().err == ""


def test_unknown_flag_is_refused_naming_it(capsys):
    with pytest.raises(ValueError, match="--no-such-flag"):
        load_config(SampleConfig, ["--no-such-flag", "1"], env={})
    assert capsys.readouterr().err == ""


def test_config_is_frozen():
    config = load_config(SampleConfig, [], env={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.count = 1  # type: ignore[misc]


def test_reads_os_environ_when_no_env_is_given(monkeypatch):
    monkeypatch.setenv("TXMQ_COUNT", "5")
    assert load_config(SampleConfig, []).count == 5


def test_validate_runs_after_loading():
    with pytest.raises(ValueError, match="flush"):
        load_config(BrokerConfig, [], env={"TXMQ_FLUSH": "sometimes"})
    with pytest.raises(ValueError, match="transaction_timeout_seconds"):
        load_config(BrokerConfig, ["--transaction-timeout-seconds", "-1"], env={})


def test_config_env_reproduces_the_config():
    original = load_config(BrokerConfig, [], env={
        "TXMQ_NAMESERVER_ADDRESSES": "a:1,b:2", "TXMQ_FLUSH": "async", "TXMQ_CHECK_MAX": "3",
        "TXMQ_TRANSACTION_TIMEOUT_SECONDS": "0.5",
    })
    env = config_env(original)
    assert env["TXMQ_NAMESERVER_ADDRESSES"] == "a:1,b:2"
    assert set(env) == {env_name(f) for f in field_names(BrokerConfig)}
    assert load_config(BrokerConfig, [], env=env) == original


def test_config_env_spells_booleans_so_they_parse_back():
    config = load_config(SampleConfig, [], env={"TXMQ_ENABLED": "yes"})
    assert config_env(config)["TXMQ_ENABLED"] == "true"
    assert load_config(SampleConfig, [], env=config_env(config)).enabled is True
