"""The Spark connector over TLS: its `tls.*` options (the CLI's --tls-* flags) reach the
driver's and the tasks' channels; without them a TLS cluster refuses the read."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

import txmq
from tests.support.certs import CertificateAuthority
from tests.support.cluster import Cluster


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    ca = CertificateAuthority(tmp_path_factory.mktemp("pki"))
    c = Cluster(tmp_path_factory.mktemp("pipeline-tls"), tls=ca)
    try:
        yield c
    finally:
        c.stop()


def test_a_batch_read_over_mutual_tls(spark: Any, secure: Cluster, unique_name) -> None:
    topic = unique_name("tls-read")
    secure.create_topic(topic, 2)
    with txmq.Producer(secure.nameserver_address, tls=secure.client_tls()) as producer:
        for i in range(5):
            producer.send(txmq.Message(topic, b"tls-%d" % i))
    tls = secure.client_tls()
    options = {"nameserver": secure.nameserver_address, "topic": topic,
               "tls.ca": tls.ca_file, "tls.cert": tls.cert_file, "tls.key": tls.key_file}
    rows = spark.read.format("txmq").options(**options).load().select("body").collect()
    assert sorted(bytes(r.body) for r in rows) == [b"tls-%d" % i for i in range(5)]

    plain = {k: v for k, v in options.items() if not k.startswith("tls.")}
    with pytest.raises(Exception, match="(?i)unavailable"):
        spark.read.format("txmq").options(**plain).load().collect()
