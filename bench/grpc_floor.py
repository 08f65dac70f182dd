"""What Python's gRPC alone costs per request on this machine, paced like one caller: the
floor under the services' CPU per transaction that issue 29's one-caller target (600 µs)
meets before the broker does any work of its own.

    python -m bench.grpc_floor [--calls 600] [--pace-ms 3] [--bytes 300]

A bare ``grpc.aio`` server on uvloop (the broker's stack: ``services/common/runtime.py``,
``services/common/server.py``, no interceptors) echoes each request, in a process of its
own; a sync ``grpc`` client in another (the SDK's consumer and sync producers) sends one at
a time with ``--pace-ms`` between them (~one caller's transaction interval: each request
then wakes an idle server, as at one caller) two ways, and then a ``grpc.aio`` client the
stream way (the asyncio SDK's side):

- **unary**: a new call per request (ReceiveMessages, SendMessage, EndTransaction);
- **stream message**: one request and its answer on a bidirectional stream kept open (the
  Produce stream), its requests fed from a queue as ``sdk/txmq/_produce_stream.py`` does.

Each is the CPU time of the whole process (every thread: gRPC's own pollers too) over the
timed calls, divided by them. ``python -m bench.outbox`` runs it once per run and prints
the services' floor beside the one-caller target: the broker's requests of a transaction
(its metrics' per-transaction counts) times these costs.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import queue
import resource
import sys
import time
from dataclasses import dataclass
from typing import Any

_METHOD = "/bench.Floor/"


@dataclass(frozen=True)
class Floor:
    """CPU µs per request (server, client), measured paced."""
    unary_server_us: float
    unary_client_us: float
    stream_server_us: float
    stream_client_us: float
    #: The client side of a stream message from ``grpc.aio`` (the asyncio SDK's Produce stream).
    aio_stream_client_us: float
    pace_ms: float

    def line(self) -> str:
        return (f"Python gRPC alone, paced {self.pace_ms:g} ms: a unary call {self.unary_server_us:,.0f} µs of "
                f"server CPU ({self.unary_client_us:,.0f} µs client), a stream message and its answer "
                f"{self.stream_server_us:,.0f} µs ({self.stream_client_us:,.0f} µs client, "
                f"{self.aio_stream_client_us:,.0f} µs from grpc.aio)")


def _cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _serve(ports: Any) -> None:
    import grpc
    import uvloop

    async def main() -> None:
        async def unary(request: bytes, context: Any) -> bytes:
            return request

        async def stream(requests: Any, context: Any) -> None:
            while (request := await context.read()) is not grpc.aio.EOF:
                await context.write(request)

        handlers = {"Unary": grpc.unary_unary_rpc_method_handler(unary),
                    "Stream": grpc.stream_stream_rpc_method_handler(stream)}
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Floor", handlers),))
        ports.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await server.wait_for_termination()

    uvloop.install()
    asyncio.run(main())


def _client(port: int, server_pid: int, calls: int, pace: float, size: int, results: Any) -> None:
    import grpc

    payload = b"x" * size
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    unary = channel.unary_unary(_METHOD + "Unary")
    requests: queue.Queue[bytes | None] = queue.Queue()
    answers = channel.stream_stream(_METHOD + "Stream")(iter(requests.get, None))

    def on_stream() -> Any:
        requests.put(payload)
        return next(answers)

    measured = {}
    for kind, call in (("unary", lambda: unary(payload, timeout=10)), ("stream", on_stream)):
        for _ in range(50):  # warm: the connection, the stream, the first calls' allocations
            call()
        server0, own0 = _cpu_seconds(server_pid), _own_cpu()
        for _ in range(calls):
            call()
            time.sleep(pace)
        measured[kind] = ((_cpu_seconds(server_pid) - server0) / calls * 1e6, (_own_cpu() - own0) / calls * 1e6)
    requests.put(None)
    channel.close()
    measured["aio"] = asyncio.run(_aio_stream_client(port, server_pid, calls, pace, payload))
    results.put(measured)


async def _aio_stream_client(port: int, server_pid: int, calls: int, pace: float,
                             payload: bytes) -> tuple[float, float]:
    """(server, client) CPU µs per stream message and its answer from a ``grpc.aio`` client
    (the default event loop, as the benchmark's asyncio callers run)."""
    import grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(_METHOD + "Stream")()
        for _ in range(50):
            await call.write(payload)
            await call.read()
        server0, own0 = _cpu_seconds(server_pid), _own_cpu()
        for _ in range(calls):
            await call.write(payload)
            await call.read()
            await asyncio.sleep(pace)
        spent = ((_cpu_seconds(server_pid) - server0) / calls * 1e6, (_own_cpu() - own0) / calls * 1e6)
        await call.done_writing()
    return spent


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(calls: int = 600, pace_ms: float = 3.0, size: int = 300) -> Floor:
    """Both ways, in two processes of their own (started with spawn: no gRPC state forked)."""
    spawn = multiprocessing.get_context("spawn")
    ports, results = spawn.Queue(), spawn.Queue()
    server = spawn.Process(target=_serve, args=(ports,), daemon=True)
    server.start()
    try:
        port = ports.get(timeout=60)
        client = spawn.Process(target=_client, args=(port, server.pid, calls, pace_ms / 1000, size, results),
                               daemon=True)
        client.start()
        measured = results.get(timeout=60 + calls * (pace_ms / 1000 + 0.01) * 3)
        client.join(30)
    finally:
        server.kill()
        server.join(30)
    (unary_server, unary_client), (stream_server, stream_client) = measured["unary"], measured["stream"]
    return Floor(unary_server, unary_client, stream_server, stream_client, measured["aio"][1], pace_ms)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--pace-ms", type=float, default=3.0)
    parser.add_argument("--bytes", type=int, default=300)
    args = parser.parse_args(argv)
    print(measure(args.calls, args.pace_ms, args.bytes).line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
