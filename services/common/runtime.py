"""Process entry point shared by the services' ``__main__`` modules: configuration, JSON
logging, SIGTERM/SIGINT handling and the ready file tests and tooling wait for."""

from __future__ import annotations

import asyncio
import dataclasses
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Awaitable, Callable

import uvloop

from .auth import service_credentials
from .channels import use_credentials
from .config import env_name, load_config
from .errors import StartupError
from .logs import configure_logging
from . import tls

log = logging.getLogger(__name__)

#: Exit statuses: a refused setting, and an environment the service cannot start in.
EXIT_BAD_CONFIGURATION = 2
EXIT_CANNOT_START = 1
#: What a supervisor gives a process between its SIGTERM and a SIGKILL (Kubernetes gives 30).
SUPERVISOR_STOP_SECONDS = 15.0
#: A service's stop, from the SIGTERM to "stopped": the gRPC grace and every stop step
#: share it (``ServiceApp.stop``, :class:`~services.common.aio.Deadline`).
STOP_SECONDS = 10.0
#: How long the interpreter may take to exit once the service has stopped (asyncio.run's
#: teardown joins the default executor's threads, the interpreter every non-daemon thread).
#: With STOP_SECONDS: the process is gone within 13 s of its SIGTERM, whatever it waits on.
EXIT_STALL_SECONDS = 3.0
#: A start cancelled by a SIGTERM ends within this (then the stop goes on regardless).
START_CANCEL_SECONDS = 1.0


def describe_startup_failure(exc: BaseException, config: Any) -> str:
    """One line saying why the service could not start, naming the setting whose path or
    port is the problem when there is one."""
    if isinstance(exc, StartupError):
        return " ".join(str(exc).split())
    if isinstance(exc, FileExistsError):
        text = f"{exc.filename}: exists and is not a directory"
    elif isinstance(exc, OSError) and exc.filename:
        text = f"{exc.filename}: {exc.strerror or exc}"
    else:
        text = str(exc) or type(exc).__name__
    text = " ".join(text.split())
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if isinstance(value, str) and os.sep in value and value.rstrip(os.sep) in text:
            return f"{field.name} ({env_name(field.name)}): {text}"
    return text


def write_ready_file(path: str, **fields: Any) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump({**fields, "pid": os.getpid()}, fh)
    os.replace(tmp, path)


async def serve(config: Any, create_server: Callable[[Any], Awaitable[tuple[Any, int]]]) -> None:
    """Runs the service until SIGTERM/SIGINT; whatever fails before it is ready is a
    :class:`StartupError`."""
    stopping = asyncio.Event()
    try:
        tls.use_config(config)  # before any channel is opened
        use_credentials(service_credentials(config))
        app, port = await create_server(config)  # (a SIGTERM meanwhile ends the process at once)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        if not await _start_unless_stopped(app.start(), stopping):
            log.info("stopping before the start ended")
        elif config.ready_file:
            write_ready_file(config.ready_file, port=port, metrics_port=app.metrics_port,
                             health_port=getattr(app, "health_port", -1),
                             replication_port=getattr(app, "replication_port", -1))
    except Exception as exc:
        raise StartupError(describe_startup_failure(exc, config)) from exc
    await stopping.wait()
    # Whatever the stop waits on (a step blocking the event loop, which no deadline of the
    # loop can cut), the process is gone before a supervisor's SIGKILL.
    stopped = threading.Event()
    _exit_within(STOP_SECONDS + EXIT_STALL_SECONDS, stopped)
    log.info("stopping", extra={"fields": {"grace_seconds": config.shutdown_grace_seconds}})
    await app.stop()
    stopped.set()
    log.info("stopped")
    _exit_within(EXIT_STALL_SECONDS)


async def _start_unless_stopped(start: Awaitable[None], stopping: asyncio.Event) -> bool:
    """Runs ``start`` unless ``stopping`` is set first: a start can wait without end (a
    replica retries an unreachable etcd), and a SIGTERM then cancels it rather than going
    unheard until the supervisor's SIGKILL. Returns whether the start ended; raises what
    it raised."""
    starting = asyncio.ensure_future(start)
    signalled = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait([starting, signalled], return_when=asyncio.FIRST_COMPLETED)
    finally:
        signalled.cancel()
    if starting.done():
        starting.result()
        return True
    starting.cancel()
    await asyncio.wait([starting], timeout=START_CANCEL_SECONDS)
    return False


def _exit_within(seconds: float, stopped: threading.Event | None = None) -> None:
    """The process exits within ``seconds`` whatever else still runs: once the service has
    stopped (its store closed, its answers sent), a helper thread stuck past the stop (a
    stopped replica once outlived its SIGTERM by 15 s after logging "stopped") would
    otherwise hold the exit forever (3.11's asyncio.run joins the default executor
    without a limit). It logs the stall and every thread's stack, then exits 0: everything
    the stop does is done. With ``stopped`` (armed at the SIGTERM): if it is not set when
    the time is up, the stop itself did not finish (something blocked the event loop) and
    the exit status is 1."""
    def watchdog() -> None:
        time.sleep(seconds)
        done = stopped is None or stopped.is_set()
        try:
            if done:
                log.error("exit stalled after the stop: forcing it (every thread's stack on stderr)",
                          extra={"fields": {"seconds": seconds}})
            else:
                log.error("stop did not finish in time: forcing the exit (every thread's stack on stderr)",
                          extra={"fields": {"seconds": seconds}})
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(0 if done else 1)

    threading.Thread(target=watchdog, name="exit-watchdog", daemon=True).start()


def run_main(service: str, config_cls: type, create_server: Callable[[Any], Awaitable[tuple[Any, int]]]) -> None:
    """A refused setting: one line on stderr, exit status 2, before anything is opened or
    bound. An environment the service cannot start in: one line on stderr, exit status 1
    (the traceback is logged at DEBUG)."""
    try:
        config = load_config(config_cls, sys.argv[1:], prog=f"python -m services.{service}")
    except ValueError as exc:
        print(f"{service}: bad configuration: {' '.join(str(exc).split())}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_CONFIGURATION) from None
    configure_logging(service, config.log_level)
    try:
        # uvloop: a leaner event loop under grpc.aio (the broker's empty-RPC rate +30 %,
        # transactions +10 % in bench.transactions).
        uvloop.install()
        asyncio.run(serve(config, create_server))
    except StartupError as exc:
        log.debug("start-up failed", exc_info=exc.__cause__ or exc)
        print(f"{service}: cannot start: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_CANNOT_START) from None
    except Exception:
        logging.getLogger(service).exception("fatal error")
        raise SystemExit(1) from None
