"""Builds the broker process: store, servicer, heartbeats, disk watch and retention."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil

from txmq.v1 import broker_pb2, broker_pb2_grpc, common_pb2, nameserver_pb2

from services.common.registration import Heartbeat
from services.common.server import ServiceApp

from .bridge import StoreBridge
from .config import BrokerConfig
from .core import BrokerCore
from .metrics import BrokerMetrics
from .service import BrokerServicer

log = logging.getLogger(__name__)

SERVICE_NAME = broker_pb2.DESCRIPTOR.services_by_name["BrokerService"].full_name
#: Records one retention round removes at most (a round holds the event loop).
RETENTION_ROUND = 1000


def _fatal(exc: BaseException) -> None:
    # The store's in-memory state moved ahead of a failed write: stop at once and let the
    # restart recover from the WAL (nothing acknowledged is lost).
    log.critical("fatal store error, exiting", exc_info=exc)
    os._exit(70)


async def create_server(config: BrokerConfig) -> tuple[ServiceApp, int]:
    loop = asyncio.get_running_loop()
    metrics = BrokerMetrics()
    core = BrokerCore(config, on_fatal=_fatal)
    bridge = StoreBridge(core.db, loop, on_fatal=_fatal, on_sync=metrics.record_sync)
    core.visible_listeners.append(bridge.note_visible)
    metrics.watch(core, bridge)
    core.end_listeners.append(metrics.record_end)
    core.stored_listeners.append(metrics.record_stored)
    core.discard_listeners.append(metrics.record_discard)
    servicer = BrokerServicer(core, bridge, metrics)
    app = ServiceApp("broker", config, metrics, [(broker_pb2_grpc.add_BrokerServiceServicer_to_server, servicer)],
                     [SERVICE_NAME])
    address = config.advertise_address or f"{'127.0.0.1' if config.host in ('0.0.0.0', '') else config.host}:{app.port}"
    app.core = core  # type: ignore[attr-defined]  # tests and tools reach the domain through the app

    def info() -> nameserver_pb2.BrokerInfo:
        return nameserver_pb2.BrokerInfo(
            name=config.broker_name, address=address,
            topics=[common_pb2.TopicQueues(topic=t, queue_count=n) for t, n in sorted(core.topics.items())])

    heartbeat = Heartbeat(
        config.nameserver_addresses, config.heartbeat_interval_seconds,
        register=lambda stub: stub.RegisterBroker(nameserver_pb2.RegisterBrokerRequest(broker=info())),
        unregister=lambda stub: stub.UnregisterBroker(nameserver_pb2.UnregisterBrokerRequest(name=config.broker_name)))
    core.topic_listeners.append(lambda _topic: heartbeat.kick())
    def watch_disk() -> None:
        usage = shutil.disk_usage(config.data_dir)
        core.free_disk_bytes = usage.free
        full = usage.free < config.min_free_disk_bytes
        if full != core.disk_full:
            log.warning("free disk below floor: refusing sends" if full else "free disk back above floor",
                        extra={"fields": {"free_bytes": usage.free, "floor_bytes": config.min_free_disk_bytes}})
        core.disk_full = full
        metrics.store_bytes_value = core.db.size_bytes()

    async def disk() -> None:
        await asyncio.to_thread(watch_disk)

    async def retention() -> None:
        # In rounds of a bounded size: each round runs on the event loop and holds it.
        totals = {"dedup_expired": 0, "records_deleted": 0}
        while True:
            stats = await bridge.run(core.retention_op(RETENTION_ROUND), sync=False)
            for name, value in stats.items():
                totals[name] += value
            if max(stats.values()) < RETENTION_ROUND:
                break
        if any(totals.values()):
            log.info("retention", extra={"fields": totals})

    async def start() -> None:
        watch_disk()
        await heartbeat.start()

    async def stop() -> None:
        await heartbeat.stop()
        core.close()

    app.every("disk", config.disk_check_interval_seconds, disk)
    app.every("retention", config.retention_interval_seconds, retention)

    app.on_start.append(start)
    app.on_stop.append(stop)
    return app, app.port
