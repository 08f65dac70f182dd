from __future__ import annotations

import pytest

from txmq.errors import InvalidNameError, SystemTopicError
from txmq.names import (dlq_topic, in_namespace, namespace_of, qualify, unqualify, validate_group, validate_name,
                         validate_namespace, validate_receive_topic,
                         validate_send_topic)


@pytest.mark.parametrize("name", ["a", "orders", "A-b_c|d", "x" * 127, "%weird"])
def test_valid_names(name: str) -> None:
    assert validate_name("topic", name) == name


@pytest.mark.parametrize("name", ["", "x" * 128, "has space", "dot.ted", "ünï", "a/b", "tab\t"])
def test_invalid_names_name_the_field_and_rule(name: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        validate_name("consumer_group", name)
    assert info.value.field == "consumer_group"
    assert "127" in str(info.value)


@pytest.mark.parametrize("topic", ["%HALF%", "%DLQ%g", "%DISCARD%g", "%anything"])
def test_clients_cannot_send_to_system_topics(topic: str) -> None:
    with pytest.raises(SystemTopicError):
        validate_send_topic(topic)


def test_dead_letter_topics_can_be_received_explicitly() -> None:
    assert validate_receive_topic(dlq_topic("g1")) == "%DLQ%g1"
    with pytest.raises(SystemTopicError):
        validate_receive_topic("%HALF%")


def test_groups_cannot_use_the_system_prefix() -> None:
    with pytest.raises(InvalidNameError):
        validate_group("producer_group", "%DLQ%x")


# --- namespaces ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["staging%orders", "a-b_C9%x|y", "%DLQ%staging%billing", "%DISCARD%ns%g"])
def test_a_name_holds_one_valid_namespace(name: str) -> None:
    assert validate_name("topic", name) == name


@pytest.mark.parametrize("name", ["a%b%c", "%orders", "x%", "a|b%orders", "n" * 65 + "%orders"])
def test_a_user_name_cannot_hold_two_namespaces_or_a_bad_one(name: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        validate_group("consumer_group", name)
    assert info.value.field == "consumer_group"


def test_qualify_and_unqualify_are_inverse() -> None:
    for name in ("orders", "%DLQ%billing", "%DISCARD%tx"):
        wire = qualify("staging", "topic", name)
        assert namespace_of(wire) == "staging" and unqualify("staging", wire) == name
    assert qualify("staging", "topic", "orders") == "staging%orders"
    assert qualify("staging", "topic", "%DLQ%billing") == "%DLQ%staging%billing"
    assert qualify("", "topic", "any%thing") == "any%thing"  # no namespace: names pass as they travel
    assert unqualify("staging", "prod%orders") == "prod%orders" and namespace_of("orders") == ""


@pytest.mark.parametrize("name", ["prod%orders", "%DLQ%prod%billing"])
def test_a_name_in_a_namespace_cannot_smuggle_another(name: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        qualify("staging", "topic", name)
    assert info.value.field == "topic" and "cannot name a namespace" in str(info.value)


@pytest.mark.parametrize("namespace", ["has space", "a%b", "n" * 65, "dot.ted"])
def test_a_bad_namespace_is_refused_naming_the_field(namespace: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        in_namespace(namespace, "topic", "orders")
    assert info.value.field == "namespace" and "64" in str(info.value)
    assert validate_namespace("") == "" and in_namespace("", "topic", "") == ""
