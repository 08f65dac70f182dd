"""The broker's configuration check at start (issue 32, item 5): an ``advertise_address``
without its port is refused with a sentence naming the field, before the broker starts —
not accepted and then never registered (the name servers cannot dial it). The broker process
refusing it is tests/integration/test_startup.py's."""

from __future__ import annotations

import pytest

from services.broker.config import BrokerConfig
from services.common.config import load_config


@pytest.mark.parametrize("address", ["broker-0.brokers.txmq.svc", "10.0.0.7", "host:", ":10911", "host:port",
                                     "::1", "host:99999"])
def test_an_advertise_address_without_a_port_is_refused_naming_the_field(address) -> None:
    with pytest.raises(ValueError, match="advertise_address must be host:port"):
        load_config(BrokerConfig, [], env={"TXMQ_ADVERTISE_ADDRESS": address})


@pytest.mark.parametrize("address", ["broker-0.brokers.txmq.svc:10911", "10.0.0.7:10911", "[::1]:10911", ""])
def test_host_and_port_pass(address) -> None:
    assert load_config(BrokerConfig, [], env={"TXMQ_ADVERTISE_ADDRESS": address}).advertise_address == address

