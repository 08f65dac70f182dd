"""The test harness's restart of a service on its pinned port (``ServiceProcess.restart``)
when another socket takes that port between the harness's check and the service's bind:
a port-0 server or an outgoing connection of another test can be handed the port of a
service that is down. The restart waits for the port and starts again (it failed at once:
make test, test_replication.py, "port 43413 on 127.0.0.1 is already in use")."""

from __future__ import annotations

import socket
import threading
import time

from services.common.process import ServiceProcess
from tests.support.waiting import wait_until


def test_a_restart_whose_port_is_taken_at_its_bind_waits_for_the_port_and_keeps_it(tmp_path) -> None:
    # Under a command prefix the harness does not check the port itself (the address may be
    # another namespace's): the service's own refusal is all it sees, as when it loses the race.
    service = ServiceProcess("services.nameserver", {}, tmp_path, "nameserver", command_prefix=["env"])
    service.start()
    port = int(service.wait_ready(30)["port"])
    try:
        service.stop()
        taker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        taker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taker.bind(("127.0.0.1", port))
        taker.listen()

        def release_once_refused() -> None:
            try:
                wait_until(lambda: "already in use" in service.log_path.read_text(), 30, interval=0.05,
                           message="the restarted service never found its port taken")
                time.sleep(0.3)  # refused more than once, perhaps
            finally:
                taker.close()

        releaser = threading.Thread(target=release_once_refused)
        releaser.start()
        try:
            ready = service.restart(timeout=30)
        finally:
            releaser.join()
        assert int(ready["port"]) == port
        assert service.running
    finally:
        service.stop()
