"""The checkers' RPCs of BrokerService — ``ClaimChecks`` and ``ReportChecks`` — proto ⇄
domain for ``service.BrokerServicer``, which delegates them to ``CheckerRpc``.

It owns the claims held on the broker: a session's claim that finds nothing due for its
groups waits (``claimwaits.py``) until a check of theirs may fall due or its wait ends, in a
place of its connection's long polls (a checker is a service identity: limited per
connection only), with its checker live for those groups meanwhile (``receivers.py``), and
claims again once its checker's rights are decided again. The domain is ``checks.Claims``.
"""

from __future__ import annotations

from typing import Any

from txmq.v1 import broker_pb2, common_pb2

from services.common.auth import recheck
from services.common.errors import OK, entry_status
from services.common.limits import ConnectionLimit

from .bridge import StoreBridge
from .checks import CheckReport, ClaimBatch
from .claimwaits import ClaimWaits, hold_until
from .convert import ANSWERS_FROM_PROTO, OUTCOMES_FROM_PROTO, message_to_proto, state_to_proto
from .core import BrokerCore
from .store.db import Op


class CheckerRpc:
    def __init__(self, core: BrokerCore, bridge: StoreBridge, long_polls: ConnectionLimit) -> None:
        self.core = core
        self.bridge = bridge
        #: The claims held now, per connection (they count as its long polls).
        self.long_polls = long_polls
        #: Claims that found nothing due, held until a check of theirs may be (``claimwaits.py``).
        self.waits = ClaimWaits()
        core.schedule.on_lowered = self.waits.lowered

    async def claim(self, request: broker_pb2.ClaimChecksRequest, context: Any) -> broker_pb2.ClaimChecksResponse:
        peer = context.peer()
        checker = request.checker_id or peer
        if request.session_id:
            batch, served = await self._session_claim(request, peer, checker)
        else:
            checks = await self.bridge.run(self.core.claim_op(request.producer_groups, request.max_checks,
                                                              request.lease_seconds))
            batch = ClaimBatch(checks)
            served = {g: request.max_checks for g in request.producer_groups}
        self.core.receivers.claimed(checker, served, self.core.clock())
        response = broker_pb2.ClaimChecksResponse(groups_needed=batch.groups_needed, more_due=batch.more_due)
        for c in batch.checks:
            record = self.core.read_message(c.row.seq)
            response.tasks.append(broker_pb2.CheckTask(
                transaction_id=self.core.txn_id(c.row.seq),
                message=message_to_proto(record) if record is not None else common_pb2.Message(),
                due_at_ms=c.due_ms, attempt=c.attempt, broker_name=self.core.name,
                claim_token=c.row.claim_token, prepared_at_ms=c.row.prepared_ms))
        return response

    async def _session_claim(self, request: broker_pb2.ClaimChecksRequest, peer: str,
                             checker: str) -> tuple[ClaimBatch, dict[str, int]]:
        """A claim session's claim, held while nothing is due for its groups; the batch and
        the groups the session serves (with their capacity)."""
        groups = ({g.producer_group: g.max_checks for g in request.groups}
                  if request.groups or not request.groups_version else None)

        def claim() -> Op:
            return self.core.session_claim_op(
                request.session_id, request.groups_version, groups,
                {g.producer_group: g.max_checks for g in request.limits}, request.max_checks,
                request.lease_seconds)
        batch: ClaimBatch = await self.bridge.run(claim())
        served = self.core.claims.session_groups(request.session_id)
        if not (batch.checks or batch.groups_needed or batch.more_due):
            until = hold_until(self.core.clock(), request.wait_ms, self.core.schedule.earliest(served))
            if until is not None and self.long_polls.available(peer) > 0:
                with self.long_polls.hold(peer), self.core.receivers.holding(checker, served, self.core.clock()):
                    await self.waits.hold(until, self.core.clock)  # its checker live meanwhile
                recheck()  # a checker's identity revoked while the claim waited
                batch = await self.bridge.run(claim())
        return batch, served

    async def report(self, request: broker_pb2.ReportChecksRequest) -> broker_pb2.ReportChecksResponse:
        # An unknown enum number becomes 0, which the report refuses (per entry, naming the field).
        reports = [CheckReport(r.transaction_id, r.claim_token, OUTCOMES_FROM_PROTO.get(r.outcome, 0),
                               ANSWERS_FROM_PROTO.get(r.result, 0), r.retry_after_seconds,
                               r.answer_timeout_seconds, r.producer_group) for r in request.reports]
        results = await self.bridge.run(self.core.report_op(reports))
        response = broker_pb2.ReportChecksResponse()
        for error, state, late in results:
            response.entries.append(OK if error is None else entry_status(error))
            response.states.append(state_to_proto(state))
            response.late.append(late)
        return response
