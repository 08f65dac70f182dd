"""Checker configuration (``TXMQ_*`` environment variables or ``--flags``)."""

from __future__ import annotations

import dataclasses
import socket

from services.common.config import HOUR, ServiceConfig, count, seconds


def default_checker_name() -> str:
    """``checker-<hostname>``: stable across restarts of a pod (the StatefulSet pod name)."""
    return "checker-" + socket.gethostname()


@dataclasses.dataclass(frozen=True)
class CheckerConfig(ServiceConfig):
    port: int = 10921
    #: Registered with the name servers and sent to brokers as the claiming checker's id.
    checker_name: str = dataclasses.field(default_factory=default_checker_name)
    #: host:port producers dial; defaults to ``<host>:<bound port>`` (127.0.0.1 for 0.0.0.0).
    advertise_address: str = ""
    #: Every name server (comma-separated host:port); the checker registers with each.
    nameserver_addresses: tuple[str, ...] = ()
    #: How often the checker re-registers with every name server (until a name server tells it its own interval).
    heartbeat_interval_seconds: float = seconds(10.0, max=HOUR)
    #: How often the live brokers are listed again (brokers joining and leaving).
    broker_refresh_seconds: float = seconds(5.0, max=HOUR)
    #: Pause between two claims of a broker that returned less than a full batch.
    claim_interval_seconds: float = seconds(0.2, max=HOUR)
    #: Most checks one ClaimChecks asks for; a full batch is followed by another claim at once.
    claim_batch: int = count(256)
    #: A claimed check nobody reported on becomes due again after this long (broker side,
    #: which takes at most an hour).
    lease_seconds: float = seconds(10.0, max=HOUR)
    #: How long a producer has to start a check it was sent, and then to answer it (at
    #: most lease_seconds); a later answer still counts.
    answer_timeout_seconds: float = seconds(5.0, max=HOUR)
    #: Most checks one producer stream may be sent ahead (the most credit it may hold).
    stream_queue_size: int = count(1024, max=1_000_000)
    #: Credit of a producer stream without flow control (an SDK that announces none):
    #: checks sent to it and not yet answered, handed back or forgotten.
    default_check_credit: int = count(64, max=1_000_000)
    #: Checks one connection's streams may be owed at once (the credit they announce, added
    #: up); a stream announcing more is refused with RESOURCE_EXHAUSTED naming this.
    max_pending_checks_per_connection: int = count(16_384, max=100_000_000)
    #: Most reports in one ReportChecks call.
    report_batch: int = count(512)
    #: Deadline of each call to a broker or a name server.
    rpc_timeout_seconds: float = seconds(5.0, max=HOUR)
    #: Most producer groups one Subscribe may name.
    max_groups_per_stream: int = count(64)

    def validate(self) -> None:
        """Rules across fields (each field's own range is declared beside it)."""
        if not self.checker_name or any(ch.isspace() for ch in self.checker_name):
            raise ValueError(f"checker_name must be set, without spaces, got {self.checker_name!r}")
        if self.answer_timeout_seconds > self.lease_seconds:
            # An acknowledgement later than the lease would be reported on a claim that
            # another checker may already hold.
            raise ValueError(f"answer_timeout_seconds ({self.answer_timeout_seconds}) must not exceed "
                             f"lease_seconds ({self.lease_seconds})")
