"""A loopback TCP relay in front of a real service that holds the first bytes the service
sends on each connection for ``first_reply_delay_seconds``: what a client sees of a server
whose process a loaded machine does not schedule for a while as the connection starts (its
HTTP/2 SETTINGS frame comes late). The connect itself completes at once (the kernel accepts).

    with SlowStartRelay(cluster.nameserver_address, first_reply_delay_seconds=0.5) as relay:
        txmq.Producer(relay.address)...
"""

from __future__ import annotations

import socket
import threading
import time


class SlowStartRelay:
    def __init__(self, target: str, *, first_reply_delay_seconds: float) -> None:
        host, _, port = target.rpartition(":")
        self._target = (host, int(port))
        self.delay = first_reply_delay_seconds
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        #: Connections relayed so far.
        self.connections = 0
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        self._start(self._accept)

    def _start(self, target, *args) -> None:  # type: ignore[no-untyped-def]
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(self._target, timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    server.close()
                    return
                self.connections += 1
                self._sockets += [client, server]
            self._start(self._pump, client, server, 0.0)
            self._start(self._pump, server, client, self.delay)

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, first_delay: float) -> None:
        try:
            while data := source.recv(65536):
                if first_delay:
                    time.sleep(first_delay)  # the server's first reply, late
                    first_delay = 0.0
                sink.sendall(data)
        except OSError:
            pass  # either side closed
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets, threads = list(self._sockets), list(self._threads)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        except OSError:
            pass
        self._listener.close()
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for t in threads:
            t.join(10)

    def __enter__(self) -> "SlowStartRelay":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
