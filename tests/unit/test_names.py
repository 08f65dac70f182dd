from __future__ import annotations

import pytest

from txmq.errors import InvalidNameError, SystemTopicError
from txmq.names import (dlq_topic, validate_group, validate_name, validate_receive_topic,
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
