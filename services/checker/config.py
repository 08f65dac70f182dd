"""Checker configuration (``TXMQ_*`` environment variables or ``--flags``)."""

from __future__ import annotations

import dataclasses
import socket

from services.common.config import ServiceConfig


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
    heartbeat_interval_seconds: float = 10.0
    #: How often the live brokers are listed again (brokers joining and leaving).
    broker_refresh_seconds: float = 5.0
    #: Pause between two claims of a broker that returned less than a full batch.
    claim_interval_seconds: float = 0.2
    #: Most checks one ClaimChecks asks for; a full batch is followed by another claim at once.
    claim_batch: int = 256
    #: A claimed check nobody reported on becomes due again after this long (broker side).
    lease_seconds: float = 10.0
    #: How long a producer has to acknowledge a check, and then to answer it.
    answer_timeout_seconds: float = 5.0
    #: Most checks one producer stream may be sent ahead (the most credit it may hold).
    stream_queue_size: int = 1024
    #: Credit of a producer stream without flow control (an SDK that announces none):
    #: checks sent to it and not yet answered, handed back or forgotten.
    default_check_credit: int = 64
    #: Most reports in one ReportChecks call.
    report_batch: int = 512
    #: Deadline of each call to a broker or a name server.
    rpc_timeout_seconds: float = 5.0
    #: Most producer groups one Subscribe may name.
    max_groups_per_stream: int = 64

    def validate(self) -> None:
        if not self.checker_name or any(ch.isspace() for ch in self.checker_name):
            raise ValueError(f"checker_name must be set, without spaces, got {self.checker_name!r}")
        for name in ("heartbeat_interval_seconds", "broker_refresh_seconds", "claim_interval_seconds",
                     "lease_seconds", "answer_timeout_seconds", "rpc_timeout_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.lease_seconds > 3600:
            raise ValueError(f"lease_seconds must be at most 3600, got {self.lease_seconds}")
        if self.answer_timeout_seconds > self.lease_seconds:
            # An acknowledgement later than the lease would be reported on a claim that
            # another checker may already hold.
            raise ValueError(f"answer_timeout_seconds ({self.answer_timeout_seconds}) must not exceed "
                             f"lease_seconds ({self.lease_seconds})")
        for name in ("claim_batch", "stream_queue_size", "report_batch", "max_groups_per_stream",
                     "default_check_credit"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
