"""Builds the broker process: store, servicer, heartbeats, disk watch and retention.

With ``replication_factor`` 1 the broker is its shard: it opens the store and serves. With
more, it is one replica of the shard (``replication.ReplicaNode``): the store is opened
once and outlives leaderships; while this replica leads, a *term* (domain, bridge and
servicer over that store) serves clients, and the BrokerService answers NotLeaderError
naming the leader otherwise. The replicas ship their log over the replication stream's own
port (``replication_port``, ``transport.py``); rebuilds and hand-overs go through
ReplicationService on the gRPC port.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from typing import Any, Callable

from txmq.v1 import (broker_pb2, broker_pb2_grpc, nameserver_pb2, operations_pb2, operations_pb2_grpc,
                     replication_pb2, replication_pb2_grpc)

from services.common.aio import Deadline, note_slow_step, step_within
from services.common.registration import Heartbeat
from services.common.server import ServiceApp

from . import ownership
from .backup import OperationsServicer
from .bridge import StoreBridge
from .config import BrokerConfig
from .core import BrokerCore, StoreIdentityError, open_database
from .drain import is_draining
from .globalpump import GlobalPump
from .metrics import BrokerMetrics
from .replication import ReplicaNode, ReplicationServicer, Term
from .service import BrokerServicer, topic_queues
from .store import codec
from .store.db import Database
from .timers import TimerPump
from .transport import ReplicationListener

log = logging.getLogger(__name__)

SERVICE_NAME = broker_pb2.DESCRIPTOR.services_by_name["BrokerService"].full_name
REPLICATION_SERVICE_NAME = replication_pb2.DESCRIPTOR.services_by_name["ReplicationService"].full_name
OPERATIONS_SERVICE_NAME = operations_pb2.DESCRIPTOR.services_by_name["OperationsService"].full_name
#: Records one retention round removes at most (a round holds the event loop).
RETENTION_ROUND = 1000
#: Bounds of a broker's stop steps: the timers, the global transactions and the replication
#: listener (cancellations, side by side); the replica (its etcd calls: resign, revoke, each
#: bounded by the coordinator's own 2 s); the heartbeat (unregistering from the name
#: servers). Every step also ends by the stop's deadline (runtime.STOP_SECONDS from the
#: SIGTERM, the gRPC grace included), which the grace is cut to leave them: the stop
#: ends within 10 s of the SIGTERM and the process within 13, under the 15 s a
#: supervisor gives a stopping broker, whatever its peers (paused, stopping too) or etcd do.
STOP_STEP_SECONDS = 1.0
STOP_REPLICA_SECONDS = 4.5
STOP_HEARTBEAT_SECONDS = 1.5


def _fatal(exc: BaseException) -> None:
    # The store's in-memory state moved ahead of a failed write: stop at once and let the
    # restart recover from the WAL (nothing acknowledged is lost).
    log.critical("fatal store error, exiting", exc_info=exc)
    os._exit(70)


def _build(config: BrokerConfig, db: Database, loop: asyncio.AbstractEventLoop,
           metrics: BrokerMetrics, pump: TimerPump,
           global_pump: GlobalPump | None = None) -> tuple[BrokerCore, StoreBridge, BrokerServicer]:
    """The domain, the bridge and the servicer over an open store."""
    core = BrokerCore(config, on_fatal=_fatal, db=db)
    if global_pump is not None:
        core.global_listeners.append(global_pump.wake)
        global_pump.wake()  # a new term: its store may hold pushes and pulls to resume
    core.timer_listeners.append(pump.wake)
    core.timer_moved_listeners.append(metrics.record_timer_moved)
    pump.wake()  # a new term: its store may hold due timers
    bridge = StoreBridge(db, loop, on_fatal=_fatal, on_sync=metrics.record_sync)
    core.visible_listeners.append(bridge.note_visible)
    core.end_listeners.append(metrics.record_end)
    core.stored_listeners.append(metrics.record_stored)
    core.discard_listeners.append(metrics.record_discard)
    core.global_outcome_listeners.append(metrics.record_global)
    return core, bridge, BrokerServicer(core, bridge, metrics)


def _leader_gate(node: ReplicaNode) -> broker_pb2_grpc.BrokerServiceServicer:
    """A BrokerService whose every method runs on the current leadership's servicer, or
    answers NotLeaderError (UNAVAILABLE, retryable, naming the leader)."""
    methods: dict[str, Callable[..., Any]] = {}
    for method in broker_pb2.DESCRIPTOR.services_by_name["BrokerService"].methods:
        name = method.name

        async def call(self: Any, request: Any, context: Any, _name: str = name) -> Any:
            return await getattr(node.serving().servicer, _name)(request, context)
        methods[name] = call
    return type("LeaderGate", (broker_pb2_grpc.BrokerServiceServicer,), methods)()


async def create_server(config: BrokerConfig) -> tuple[ServiceApp, int]:
    loop = asyncio.get_running_loop()
    metrics = BrokerMetrics()
    db = open_database(config, on_fatal=_fatal)
    replicated = config.replication_factor > 1
    owner = identity(db)
    if owner and owner != config.broker_name:
        db.close()
        raise StoreIdentityError(f"data dir {config.data_dir} belongs to broker {owner!r}, not {config.broker_name!r}")
    node: ReplicaNode | None = None
    terms: list[tuple[BrokerCore, StoreBridge]] = []  # the one serving now (empty: not leading)
    pump = TimerPump(lambda: terms[0] if terms else None)
    global_pump = GlobalPump(config, lambda: terms[0] if terms else None, metrics)

    if not replicated:
        core, bridge, servicer = _build(config, db, loop, metrics, pump, global_pump)
        terms.append((core, bridge))
        registered: list[tuple[Any, Any]] = [(broker_pb2_grpc.add_BrokerServiceServicer_to_server, servicer)]
        names = [SERVICE_NAME]
    else:
        node = ReplicaNode(config, db, address=lambda: address, replication_address=lambda: replication_address,
                           make_term=lambda epoch: make_term(epoch),
                           on_role_change=lambda: heartbeat.kick(), metrics=metrics)
        registered = [(broker_pb2_grpc.add_BrokerServiceServicer_to_server, _leader_gate(node)),
                      (replication_pb2_grpc.add_ReplicationServiceServicer_to_server, ReplicationServicer(node))]
        names = [SERVICE_NAME, REPLICATION_SERVICE_NAME]
        metrics.watch_replication(node)

    def serving() -> tuple[Database, BrokerCore, StoreBridge]:
        if node is not None:
            term = node.serving()
            return node.db, term.core, term.bridge
        return db, terms[0][0], terms[0][1]
    registered.append((operations_pb2_grpc.add_OperationsServiceServicer_to_server, OperationsServicer(
        data_dir=config.data_dir, shard=config.broker_name, replica_id=config.replica_id,
        replication_factor=config.replication_factor, serving=serving, on_drain_change=lambda: heartbeat.kick())))
    names.append(OPERATIONS_SERVICE_NAME)
    metrics.watch(lambda: terms[0] if terms else None)
    # A long poll waits by design: limited per connection, not by max_concurrent_rpcs.
    # The ids a request carries are authorized for what they name in the store serving now.
    app = ServiceApp("broker", config, metrics, registered, names, unmetered=("ReceiveMessages",),
                     auth_options={"resolve": ownership.resolver(lambda: terms[0][0] if terms else None)})
    address = config.advertise_address or f"{'127.0.0.1' if config.host in ('0.0.0.0', '') else config.host}:{app.port}"
    if not replicated:
        app.core = terms[0][0]  # type: ignore[attr-defined]  # tests and tools reach the domain through the app
    app.node = node  # type: ignore[attr-defined]
    listener: ReplicationListener | None = None
    replication_address = ""
    app.replication_port = -1  # type: ignore[attr-defined]  # in the ready file
    if node is not None:
        listener = ReplicationListener(config, node.replicate, app.auth)
        app.replication_port = await listener.start()  # type: ignore[attr-defined]
        app.replication = listener  # type: ignore[attr-defined]
        replication_address = f"{address.rpartition(':')[0]}:{app.replication_port}"
    free = {"bytes": -1, "full": False}

    def current() -> tuple[BrokerCore, StoreBridge] | None:
        return terms[0] if terms else None

    async def make_term(epoch: int) -> Term:
        assert node is not None
        core, bridge, servicer = _build(config, node.db, loop, metrics, pump, global_pump)
        core.leader_epoch = epoch  # every delivery of this leadership carries it in its receipt handle
        core.free_disk_bytes, core.disk_full = free["bytes"], free["full"]
        core.topic_listeners.append(lambda _topic: heartbeat.kick())
        terms[:] = [(core, bridge)]

        async def close() -> None:
            if terms and terms[0][0] is core:
                terms.clear()
        return Term(epoch, servicer, bridge, core, close)

    def info() -> nameserver_pb2.BrokerInfo:
        pair = current()
        topics = [topic_queues(pair[0], t, n) for t, n in sorted(pair[0].topics.items())] if pair else []
        broker = nameserver_pb2.BrokerInfo(
            name=config.broker_name, address=address, topics=topics,
            draining=is_draining(node.db if node is not None else db))
        if node is not None:
            broker.replica_id = config.replica_id
            broker.role = node.role()
            broker.leader_epoch = node.known_epoch()
            broker.replication.CopyFrom(node.status())
        return broker

    heartbeat = Heartbeat(
        config.nameserver_addresses, config.heartbeat_interval_seconds,
        register=lambda stub: stub.RegisterBroker(nameserver_pb2.RegisterBrokerRequest(broker=info())),
        unregister=lambda stub: stub.UnregisterBroker(nameserver_pb2.UnregisterBrokerRequest(
            name=config.broker_name, replica_id=config.replica_id)))
    if not replicated:
        terms[0][0].topic_listeners.append(lambda _topic: heartbeat.kick())

    def watch_disk() -> None:
        the_db = node.db if node is not None else db
        usage = shutil.disk_usage(config.data_dir)
        full = usage.free < config.min_free_disk_bytes
        if full != free["full"]:
            log.warning("free disk below floor: refusing sends" if full else "free disk back above floor",
                        extra={"fields": {"free_bytes": usage.free, "floor_bytes": config.min_free_disk_bytes}})
        free["bytes"], free["full"] = usage.free, full
        pair = current()
        if pair is not None:
            pair[0].free_disk_bytes, pair[0].disk_full = usage.free, full
        metrics.store_bytes_value = the_db.size_bytes()

    async def disk() -> None:
        await asyncio.to_thread(watch_disk)

    async def retention() -> None:
        # In rounds of a bounded size: each round runs on the event loop and holds it.
        totals = {"dedup_expired": 0, "records_deleted": 0}
        while (pair := current()) is not None:
            core, bridge = pair
            stats = await bridge.run(core.retention_op(RETENTION_ROUND), sync=False)
            for name, value in stats.items():
                totals[name] += value
            if max(stats.values()) < RETENTION_ROUND:
                break
        if any(totals.values()):
            log.info("retention", extra={"fields": totals})

    async def start() -> None:
        watch_disk()
        if node is not None:
            await node.start()
        await heartbeat.start()
        await pump.start()
        await global_pump.start()

    async def stop() -> None:
        # Every step has a deadline: one that hangs (a peer that is stopping too, a paused
        # follower, an etcd that does not answer) is cancelled and the stop goes on.
        deadline = app.stop_deadline or Deadline(STOP_STEP_SECONDS + STOP_REPLICA_SECONDS + STOP_HEARTBEAT_SECONDS)
        if node is not None:
            node.stopping()
        await asyncio.gather(
            step_within("timers", STOP_STEP_SECONDS, pump.stop(), deadline),
            step_within("global transactions", STOP_STEP_SECONDS, global_pump.stop(), deadline),
            *([step_within("replication listener", STOP_STEP_SECONDS, listener.stop(), deadline)]
              if listener is not None else []))
        if node is not None:
            await step_within("replica", STOP_REPLICA_SECONDS, node.stop(), deadline)
        await step_within("heartbeat", STOP_HEARTBEAT_SECONDS, heartbeat.stop(), deadline)  # its unregister calls
        started = time.monotonic()
        (node.db if node is not None else db).close()  # synchronous: no deadline cuts it (the exit watchdog does)
        note_slow_step("store close", started)

    app.every("disk", config.disk_check_interval_seconds, disk)
    app.every("retention", config.retention_interval_seconds, retention)

    app.on_start.append(start)
    app.on_stop.append(stop)
    app.stop_reserve_seconds = STOP_STEP_SECONDS + STOP_REPLICA_SECONDS + STOP_HEARTBEAT_SECONDS
    return app, app.port


def identity(db: Database) -> str:
    """The broker name a store belongs to ('' for a fresh one)."""
    value = db.get("meta", b"broker_name")
    return codec.unframe(value, "meta", b"broker_name").decode() if value else ""
