"""Checker configuration (``TXMQ_*`` environment variables or ``--flags``)."""

from __future__ import annotations

import dataclasses
import socket

from txmq.decisions import validate_table

from services.common.config import DAY, HOUR, MINUTE, YEAR, ServiceConfig, count, seconds


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
    #: How long a claim that finds nothing due may be held on the broker, answered as soon
    #: as a check of the checker's groups may fall due (broker.proto ClaimChecksRequest
    #: wait_ms): an idle checker then claims about once per wait instead of every
    #: claim_interval_seconds. 0: every claim is answered at once.
    claim_wait_seconds: float = seconds(1.0, min=0, max=60.0, zero="every claim is answered at once")
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
    #: Checks one principal's streams may be owed at once, all its connections together (auth
    #: on; a proxy's streams for a principal are that principal's): 1,024 producers at the
    #: default credit. A stream announcing more is refused with RESOURCE_EXHAUSTED
    #: (PRINCIPAL_LIMIT) naming this.
    max_pending_checks_per_principal: int = count(65_536, max=100_000_000)
    #: Most reports in one ReportChecks call.
    report_batch: int = count(512)
    #: Deadline of each call to a broker or a name server.
    rpc_timeout_seconds: float = seconds(5.0, max=HOUR)
    #: Most producer groups one Subscribe may name.
    max_groups_per_stream: int = count(64)
    #: Producer groups whose checks the checker answers itself from their decisions table
    #: while none of their producers is subscribed (anchored transactions,
    #: services/checker/resolver.py): ``GROUP=DSN_FILE`` entries, each file holding a libpq
    #: connection string for a role limited to that table (read at start, never logged).
    resolver_groups: tuple[str, ...] = ()
    #: The decisions table of those groups.
    resolver_table: str = "txmq_decisions"
    #: How long the resolver's check waits for a local transaction holding the key.
    resolver_lock_timeout_seconds: float = seconds(0.5, max=MINUTE)
    #: The retry-after of its IN_PROGRESS answers.
    resolver_in_progress_retry_seconds: float = seconds(5.0, max=HOUR)
    #: Checks the resolver answers at once, per group (its credit).
    resolver_concurrency: int = count(16, max=1024)
    #: While it serves a group, the resolver sweeps its table this often: COMMIT rows older
    #: than resolver_repair_after_seconds get their halves committed (idempotent) and go
    #: (an end that reached the broker before the producer died leaves no check to come);
    #: fences older than resolver_fence_retention_seconds go.
    resolver_sweep_interval_seconds: float = seconds(10.0, max=HOUR)
    #: Age past which the resolver's sweep repairs a COMMIT row.
    resolver_repair_after_seconds: float = seconds(30.0, max=DAY)
    #: Age past which the resolver's sweep deletes a fence (longer than any check window).
    resolver_fence_retention_seconds: float = seconds(7 * DAY, max=YEAR)

    def validate(self) -> None:
        """Rules across fields (each field's own range is declared beside it)."""
        try:
            validate_table(self.resolver_table)
        except Exception as err:  # noqa: BLE001 - a config error names the field
            raise ValueError(f"resolver_table: {err}") from None
        for entry in self.resolver_groups:
            group, sep, path = entry.partition("=")
            if not (sep and group and path):
                raise ValueError(f"resolver_groups: {entry!r} is not GROUP=DSN_FILE")
        if not self.checker_name or any(ch.isspace() for ch in self.checker_name):
            raise ValueError(f"checker_name must be set, without spaces, got {self.checker_name!r}")
        if self.answer_timeout_seconds > self.lease_seconds:
            # An acknowledgement later than the lease would be reported on a claim that
            # another checker may already hold.
            raise ValueError(f"answer_timeout_seconds ({self.answer_timeout_seconds}) must not exceed "
                             f"lease_seconds ({self.lease_seconds})")
