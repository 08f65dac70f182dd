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
from typing import Any, Callable, NamedTuple

from txmq.errors import UnavailableError
from txmq.v1 import (broker_pb2, broker_pb2_grpc, nameserver_pb2, operations_pb2, operations_pb2_grpc,
                     replication_pb2, replication_pb2_grpc)

from services.common.aio import Deadline, note_slow_step, step_within
from services.common.registration import Heartbeat
from services.common.server import ServiceApp

from . import ownership
from .backup import OperationsServicer
from .bridge import StoreBridge
from .config import BrokerConfig
from .convert import topic_queues
from .core import BrokerCore, StoreIdentityError, open_database
from .drain import is_draining
from .globalpump import GlobalPump
from .metrics import BrokerMetrics
from .replication import ReplicaNode, ReplicationServicer, Term
from .service import BrokerServicer
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


class Serving(NamedTuple):
    """The domain and bridge serving clients now (a term's, on a replicated shard)."""

    core: BrokerCore
    bridge: StoreBridge


def _leader_gate(node: ReplicaNode) -> broker_pb2_grpc.BrokerServiceServicer:
    """A BrokerService whose every method runs on the current leadership's servicer, or
    answers NotLeaderError (UNAVAILABLE, retryable, naming the leader)."""
    methods: dict[str, Callable[..., Any]] = {}
    for method in broker_pb2.DESCRIPTOR.services_by_name["BrokerService"].methods:
        name = method.name

        async def call(self: Any, request: Any, context: Any, _name: str = name) -> Any:
            return await getattr(node.serving().servicer, _name)(request, context)
        methods[name] = call
    gate: broker_pb2_grpc.BrokerServiceServicer = type("LeaderGate", (broker_pb2_grpc.BrokerServiceServicer,), methods)()
    return gate


class BrokerProcess:
    """One broker process: its store, what serves over it now (``serving``: always on an
    unreplicated shard; on a replicated one only while this replica leads, a term at a
    time), the pumps that run on whatever serves, the heartbeat, the disk watch and the
    retention rounds, and the gRPC app in front of them."""

    def __init__(self, config: BrokerConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.config = config
        self.loop = loop
        self.metrics = BrokerMetrics()
        self.db = open_database(config, on_fatal=_fatal)
        owner = identity(self.db)
        if owner and owner != config.broker_name:
            self.db.close()
            raise StoreIdentityError(f"data dir {config.data_dir} belongs to broker {owner!r}, "
                                     f"not {config.broker_name!r}")
        self.replicated = config.replication_factor > 1
        #: What serves clients now (None: a replica that does not lead).
        self.serving: Serving | None = None
        #: The replica of a replicated shard (None: unreplicated); it owns the store from then
        #: on (``store``).
        self.node: ReplicaNode | None = None
        self.listener: ReplicationListener | None = None
        self.timer_pump = TimerPump(self.current)
        self.global_pump = GlobalPump(config, self.current, self.metrics)
        self.heartbeat = Heartbeat(
            config.nameserver_addresses, config.heartbeat_interval_seconds,
            register=lambda stub: stub.RegisterBroker(nameserver_pb2.RegisterBrokerRequest(broker=self.info())),
            unregister=lambda stub: stub.UnregisterBroker(nameserver_pb2.UnregisterBrokerRequest(
                name=config.broker_name, replica_id=config.replica_id)))
        #: The last disk watch: free bytes (-1: not watched yet) and whether under the floor.
        self.free_disk_bytes = -1
        self.disk_full = False
        #: Where clients and the replicas reach this broker (known once the app has its port).
        self.address = ""
        self.replication_address = ""

    def current(self) -> Serving | None:
        return self.serving

    def _serving_core(self) -> BrokerCore | None:
        serving = self.serving
        return serving.core if serving is not None else None

    @property
    def store(self) -> Database:
        """The store open now (a replica's rebuild replaces the one opened at start)."""
        return self.node.db if self.node is not None else self.db

    # --- the domain over the store ---------------------------------------------------------

    def _serve(self, epoch: int = 0) -> tuple[BrokerCore, StoreBridge, BrokerServicer]:
        """A domain, bridge and servicer over the store, wired to the pumps, the metrics
        and the heartbeat, now serving."""
        metrics, db = self.metrics, self.store
        core = BrokerCore(self.config, on_fatal=_fatal, db=db)
        core.leader_epoch = epoch  # every delivery of a leadership carries it in its receipt handle
        core.free_disk_bytes, core.disk_full = self.free_disk_bytes, self.disk_full
        bridge = StoreBridge(db, self.loop, on_fatal=_fatal, on_sync=metrics.record_sync)
        listeners = core.listeners
        listeners.global_due.append(self.global_pump.wake)
        listeners.timer.append(self.timer_pump.wake)
        listeners.timer_moved.append(metrics.record_timer_moved)
        listeners.visible.append(bridge.note_visible)
        listeners.end.append(metrics.record_end)
        listeners.stored.append(metrics.record_stored)
        listeners.discard.append(metrics.record_discard)
        listeners.producer_group_gone.append(metrics.producer_group_gone)
        listeners.global_outcome.append(metrics.record_global)
        listeners.topic.append(lambda _topic: self.heartbeat.kick())
        self.serving = Serving(core, bridge)
        # Its store may hold due timers, pushes and pulls to resume.
        self.global_pump.wake()
        self.timer_pump.wake()
        return core, bridge, BrokerServicer(core, bridge, metrics)

    async def make_term(self, epoch: int) -> Term:
        """This replica leads from now on: a term serves clients over its store."""
        core, bridge, servicer = self._serve(epoch)

        async def close() -> None:
            if self.serving is not None and self.serving.core is core:
                self.serving = None
        return Term(epoch, servicer, bridge, core, close)

    def operations_target(self) -> tuple[Database, BrokerCore, StoreBridge]:
        """What OperationsService acts on (NotLeaderError on a replica that does not lead)."""
        if self.node is not None:
            term = self.node.serving()
            return self.node.db, term.core, term.bridge
        assert self.serving is not None
        return self.db, self.serving.core, self.serving.bridge

    # --- the process -----------------------------------------------------------------------

    async def build(self) -> ServiceApp:
        config = self.config
        if not self.replicated:
            _core, _bridge, servicer = self._serve()
            registered: list[tuple[Any, Any]] = [(broker_pb2_grpc.add_BrokerServiceServicer_to_server, servicer)]
            names = [SERVICE_NAME]
        else:
            node = self.node = ReplicaNode(config, self.db, address=lambda: self.address,
                                           replication_address=lambda: self.replication_address,
                                           make_term=self.make_term, on_role_change=self.heartbeat.kick,
                                           metrics=self.metrics)
            registered = [(broker_pb2_grpc.add_BrokerServiceServicer_to_server, _leader_gate(node)),
                          (replication_pb2_grpc.add_ReplicationServiceServicer_to_server, ReplicationServicer(node))]
            names = [SERVICE_NAME, REPLICATION_SERVICE_NAME]
            self.metrics.watch_replication(node)
        registered.append((operations_pb2_grpc.add_OperationsServiceServicer_to_server, OperationsServicer(
            data_dir=config.data_dir, shard=config.broker_name, replica_id=config.replica_id,
            replication_factor=config.replication_factor, serving=self.operations_target,
            on_drain_change=self.heartbeat.kick)))
        names.append(OPERATIONS_SERVICE_NAME)
        self.metrics.watch(self.current)
        # A long poll waits by design: limited per connection, not by max_concurrent_rpcs.
        # The ids a request carries are authorized for what they name in the store serving now.
        app = ServiceApp("broker", config, self.metrics, registered, names, unmetered=("ReceiveMessages",),
                         auth_options={"resolve": ownership.resolver(self._serving_core)})
        host = "127.0.0.1" if config.host in ("0.0.0.0", "") else config.host
        self.address = config.advertise_address or f"{host}:{app.port}"
        # Tests and tools reach the domain and the replica through the app.
        if self.serving is not None:
            app.core = self.serving.core  # type: ignore[attr-defined]  # for tests and tools, as above
        app.node = self.node  # type: ignore[attr-defined]  # for tests and tools, as above
        replication_port = -1
        if self.node is not None:
            self.listener = ReplicationListener(config, self.node.replicate, app.auth,
                                                on_refused=self.metrics.record_replication_refused)
            replication_port = await self.listener.start()
            app.replication = self.listener  # type: ignore[attr-defined]  # for tests and tools, as above
            self.replication_address = f"{self.address.rpartition(':')[0]}:{replication_port}"
        app.replication_port = replication_port  # type: ignore[attr-defined]  # in the ready file
        app.every("disk", config.disk_check_interval_seconds, self.watch_disk)
        app.every("retention", config.retention_interval_seconds, self.retention)
        app.on_start.append(self.start)
        app.on_stop.append(lambda: self.stop(app.stop_deadline))
        app.stop_reserve_seconds = STOP_STEP_SECONDS + STOP_REPLICA_SECONDS + STOP_HEARTBEAT_SECONDS
        return app

    def info(self) -> nameserver_pb2.BrokerInfo:
        """What the heartbeat registers."""
        config, node, serving = self.config, self.node, self.serving
        topics = ([topic_queues(serving.core, t, n) for t, n in sorted(serving.core.topics.items())]
                  if serving is not None else [])
        broker = nameserver_pb2.BrokerInfo(name=config.broker_name, address=self.address, topics=topics,
                                           draining=is_draining(self.store))
        if node is not None:
            broker.replica_id = config.replica_id
            broker.role = node.role()
            broker.leader_epoch = node.known_epoch()
            broker.replication.CopyFrom(node.status())
        return broker

    def _measure_disk(self) -> tuple[int, int]:
        """(free bytes on the data volume, the store's bytes): file system calls, on any thread."""
        return shutil.disk_usage(self.config.data_dir).free, self.store.size_bytes()

    def _note_disk(self, free: int, store_bytes: int) -> None:
        """Free disk against the floor (sends are refused below it), on the event loop."""
        config = self.config
        full = free < config.min_free_disk_bytes
        if full != self.disk_full:
            log.warning("free disk below floor: refusing sends" if full else "free disk back above floor",
                        extra={"fields": {"free_bytes": free, "floor_bytes": config.min_free_disk_bytes}})
        self.free_disk_bytes, self.disk_full = free, full
        serving = self.serving
        if serving is not None:
            serving.core.free_disk_bytes, serving.core.disk_full = free, full
        self.metrics.store_bytes_value = store_bytes

    async def watch_disk(self) -> None:
        """Measured off the loop (a slow volume never holds it), applied on it."""
        self._note_disk(*await asyncio.to_thread(self._measure_disk))

    async def retention(self) -> None:
        """Retention in rounds of a bounded size: each round runs on the event loop and holds it."""
        totals = {"dedup_expired": 0, "records_deleted": 0}
        while (serving := self.serving) is not None:
            try:
                stats = await serving.bridge.run(serving.core.retention_op(RETENTION_ROUND), sync=False)
            except UnavailableError as exc:  # the replica stepped down, or cannot commit now: next round
                log.info("retention stopped early: this replica cannot serve now",
                         extra={"fields": {"reason": exc.reason, **totals}})
                return
            for name, value in stats.items():
                totals[name] += value
            if max(stats.values()) < RETENTION_ROUND:
                break
        if any(totals.values()):
            log.info("retention", extra={"fields": totals})

    async def start(self) -> None:
        self._note_disk(*self._measure_disk())
        if self.node is not None:
            await self.node.start()
        await self.heartbeat.start()
        await self.timer_pump.start()
        await self.global_pump.start()

    async def stop(self, deadline: Deadline | None) -> None:
        # Every step has a deadline: one that hangs (a peer that is stopping too, a paused
        # follower, an etcd that does not answer) is cancelled and the stop goes on.
        deadline = deadline or Deadline(STOP_STEP_SECONDS + STOP_REPLICA_SECONDS + STOP_HEARTBEAT_SECONDS)
        node, listener = self.node, self.listener
        if node is not None:
            node.stopping()
        await asyncio.gather(
            step_within("timers", STOP_STEP_SECONDS, self.timer_pump.stop(), deadline),
            step_within("global transactions", STOP_STEP_SECONDS, self.global_pump.stop(), deadline),
            *([step_within("replication listener", STOP_STEP_SECONDS, listener.stop(), deadline)]
              if listener is not None else []))
        if node is not None:
            await step_within("replica", STOP_REPLICA_SECONDS, node.stop(), deadline)
        await step_within("heartbeat", STOP_HEARTBEAT_SECONDS, self.heartbeat.stop(), deadline)  # its unregister calls
        started = time.monotonic()
        self.store.close()  # synchronous: no deadline cuts it (the exit watchdog does)
        note_slow_step("store close", started)


async def create_server(config: BrokerConfig) -> tuple[ServiceApp, int]:
    app = await BrokerProcess(config, asyncio.get_running_loop()).build()
    return app, app.port


def identity(db: Database) -> str:
    """The broker name a store belongs to ('' for a fresh one)."""
    value = db.get("meta", b"broker_name")
    return codec.unframe(value, "meta", b"broker_name").decode() if value else ""
