"""etcd for brokers only (issue 30): with mutual TLS, etcd's authentication takes the user
from the certificate's common name and only the brokers' users hold the role on txmq's
prefix — an application's certificate from the same CA is refused, as are clients without a
certificate and the broker outside txmq's keys; with passwords (a plaintext etcd) the same
holds for users. A broker keeps working across an etcd restart (its token is fetched again)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.broker.coordination import EtcdUnavailable, ShardCoordinator
from services.common.etcd import EtcdCredentials
from tests.support.etcd import EtcdProcess, password_auth
from tests.support.ownership import Census, etcd_census

pytestmark = pytest.mark.timeout(180)


def test_only_brokers_touch_txmqs_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    census = Census()
    problems = etcd_census(tmp_path, census)
    with capsys.disabled():
        print("\n" + census.table())
    assert problems == []
    assert len(census.attempts) >= 12
    assert not census.successes, census.table()
    (app_write,) = [a for a in census.attempts if a.name.startswith("etcd Put of a shard's leader key")]
    assert app_write.outcome.startswith("PERMISSION_DENIED"), app_write


def test_a_broker_authenticates_again_after_etcd_restarts(tmp_path: Path) -> None:
    """Password mode: etcd forgets its tokens when it restarts; the broker's next call after
    a refusal authenticates again."""
    auth = password_auth(tmp_path / "auth")
    etcd = EtcdProcess(tmp_path, auth=auth).start()
    try:
        credentials = EtcdCredentials(auth.broker_users[0], str(tmp_path / "auth" / "etcd-broker.password"))

        async def run() -> None:
            coord = ShardCoordinator((etcd.endpoint,), "/txmq", "broker-0", 0, credentials=credentials)
            try:
                assert (await coord.read()).leader is None
                etcd.restart()
                for _ in range(50):
                    try:
                        await coord.read()
                        return
                    except EtcdUnavailable:
                        await asyncio.sleep(0.1)
                raise AssertionError("the coordinator never read again after etcd restarted")
            finally:
                await coord.close()

        asyncio.run(run())
    finally:
        etcd.stop()


def test_a_wrong_password_keeps_the_broker_out(tmp_path: Path) -> None:
    auth = password_auth(tmp_path / "auth")
    etcd = EtcdProcess(tmp_path, auth=auth).start()
    try:
        wrong = tmp_path / "wrong.password"
        wrong.write_text("not-it\n")
        credentials = EtcdCredentials(auth.broker_users[0], str(wrong))

        async def run() -> None:
            coord = ShardCoordinator((etcd.endpoint,), "/txmq", "broker-0", 0, credentials=credentials)
            try:
                with pytest.raises(EtcdUnavailable, match="authentication failed"):
                    await coord.read()
            finally:
                await coord.close()

        asyncio.run(run())
    finally:
        etcd.stop()


def test_the_lease_is_held_through_an_etcd_outage_with_authentication(tmp_path: Path) -> None:
    """etcd down under authentication: every renewal fails as EtcdUnavailable (the token's
    interceptor made the keep-alive stream fail with InvalidStateError, which killed the
    lease task silently: the lease expired, was never granted again, and every campaign
    after named the lost lease — the shard without a leader for good, seen in
    tests.chaos_anchored after restart-etcd). Once etcd is back the lease is renewed or
    granted again."""
    auth = password_auth(tmp_path / "auth")
    etcd = EtcdProcess(tmp_path, auth=auth).start()
    port = int(etcd.endpoint.rpartition(":")[2])
    try:
        credentials = EtcdCredentials(auth.broker_users[0], str(tmp_path / "auth" / "etcd-broker.password"))

        async def run() -> None:
            coord = ShardCoordinator((etcd.endpoint,), "/txmq", "broker-0", 0, credentials=credentials)
            expired: list[float] = []

            async def on_expired() -> None:
                expired.append(coord.renewed_at)

            try:
                await coord.grant_lease(2)
                holding = asyncio.create_task(coord.hold_lease(on_expired))
                etcd.stop()
                for _ in range(6):
                    with pytest.raises(EtcdUnavailable):
                        await coord.keep_alive()
                await asyncio.sleep(3)  # past the lease's TTL, renewals failing all along
                assert not holding.done(), holding
                etcd.start(client_port=port)
                down_since = coord.renewed_at
                for _ in range(300):
                    if coord.renewed_at > down_since:
                        break
                    await asyncio.sleep(0.1)
                assert coord.renewed_at > down_since, "the lease was never renewed nor granted again"
                assert not holding.done(), holding
                holding.cancel()
                await asyncio.gather(holding, return_exceptions=True)
            finally:
                await coord.close()

        asyncio.run(run())
    finally:
        etcd.stop()
