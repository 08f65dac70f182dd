"""Syncing the broker's write-ahead log without the event loop ever waiting for a disk.

Why a helper process: the broker applies every request on its event loop and writes it to
RocksDB unsynced (``db.py``); RocksDB has appended the batch to its WAL file with write(2)
by then, so only fdatasync(2) is missing for it to survive a crash of the machine. That
takes ~0.5–5 ms. rocksdict holds the GIL through a synced write, which would freeze the
event loop for as long; a thread that syncs outside the GIL must take the GIL back after
each sync and waits behind the busy event loop for the interpreter's switch interval
(5 ms), which caps the broker at a few hundred syncs a second. A process has no GIL to
take back: the event loop hands it a number and later reads the answer from a pipe.

The protocol on the helper's stdin and stdout is one unsigned 64-bit little-endian number
per message. The broker writes ``T`` after its write number ``T``: "make every write up to
T durable". The helper reads all numbers waiting, syncs once (the group commit: every
write since the previous sync shares it) and answers the highest. An answer ``T`` means
every write numbered ``T`` or lower is durable. The broker keeps one request in flight.

What is synced: every ``*.log`` file in the WAL directory (RocksDB's write-ahead logs: the
current one and an older one not yet removed after a memtable switch) with fdatasync, and
the directory itself with fsync whenever a log file appeared since the last sync, so its
name survives too. A log RocksDB has already deleted needs nothing: its contents were
flushed to SST files, which RocksDB syncs itself. fdatasync acts on the file, not on a
descriptor, so the helper's own read-only descriptors sync what the broker wrote.

A failed sync (EIO, ENOSPC) ends the helper with status 1: after a failed fsync the page
cache can no longer be trusted to hold the data, and the broker, seeing the pipe close,
stops and recovers from what is on disk. The helper ends with status 0 when the broker
closes its stdin (the broker stopped or died).

Run by the broker as ``python -I walsync.py WAL_DIR``: the script imports only the
standard library.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

TICKET_BYTES = 8
#: Directory times older than this are trusted to show every later change.
_SETTLED_NS = 1_000_000_000


class WalSyncerGoneError(Exception):
    """The helper process ended (a failed sync, or it was killed)."""


class WalSyncer:
    """The broker's side: starts the helper and talks to it without ever blocking.

    ``request`` writes a ticket; ``read_synced`` returns the highest ticket answered so far
    (call it when ``fileno()`` is readable: the event loop watches it)."""

    def __init__(self, wal_dir: str) -> None:
        self.wal_dir = wal_dir
        self._proc = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), wal_dir],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._out = self._proc.stdin.fileno()
        self._in = self._proc.stdout.fileno()
        os.set_blocking(self._in, False)
        self._partial = b""
        self.syncs_requested = 0
        self.syncs_done = 0

    @property
    def pid(self) -> int:
        return self._proc.pid

    def fileno(self) -> int:
        return self._in

    def request(self, ticket: int) -> None:
        try:
            os.write(self._out, ticket.to_bytes(TICKET_BYTES, "little"))
        except (BrokenPipeError, OSError) as exc:
            raise WalSyncerGoneError(f"WAL sync helper gone ({self._status()})") from exc
        self.syncs_requested += 1

    def read_synced(self) -> int | None:
        """The highest ticket the helper has answered since the last call (None if none)."""
        try:
            data = os.read(self._in, 4096)
        except BlockingIOError:
            return None
        if not data:
            raise WalSyncerGoneError(f"WAL sync helper gone ({self._status()})")
        data = self._partial + data
        whole = len(data) - len(data) % TICKET_BYTES
        self._partial = data[whole:]
        if not whole:
            return None
        self.syncs_done += whole // TICKET_BYTES
        return int.from_bytes(data[whole - TICKET_BYTES:whole], "little")

    def _status(self) -> str:
        code = self._proc.poll()
        return "still running" if code is None else f"exit status {code}"

    def close(self, timeout: float = 5.0) -> None:
        """Closes the helper's stdin (it exits) and reaps it."""
        for stream in (self._proc.stdin, self._proc.stdout):
            try:
                stream.close()  # type: ignore[union-attr]
            except OSError:
                pass
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


# --- the helper process ---------------------------------------------------------------------

class _LogFiles:
    """Open read-only descriptors of the WAL directory's ``*.log`` files."""

    def __init__(self, wal_dir: str) -> None:
        self.wal_dir = wal_dir
        self.dir_fd = os.open(wal_dir, os.O_RDONLY | os.O_DIRECTORY)
        self.files: dict[str, int] = {}
        self._listed: tuple[int, int] | None = None

    def sync(self) -> None:
        # The directory is listed again only when an entry may have been added or removed
        # since the last listing: its times moved, or they are so recent that a change in
        # the same clock tick (file times are coarse, a few ms) would not move them. A
        # stat costs ~1 µs, a listing ~15 µs, and there is a sync per group commit.
        st = os.fstat(self.dir_fd)
        stamp = (st.st_ctime_ns, st.st_mtime_ns)
        if must_list(stamp, self._listed, time.time_ns()):
            self._listed = stamp
            self._follow()
        for fd in self.files.values():
            os.fdatasync(fd)

    def _follow(self) -> None:
        names = {e.name for e in os.scandir(self.wal_dir) if e.name.endswith(".log")}
        for name in [n for n in self.files if n not in names]:
            os.close(self.files.pop(name))
        appeared = False
        for name in names:
            if name not in self.files:
                try:
                    self.files[name] = os.open(os.path.join(self.wal_dir, name), os.O_RDONLY)
                except FileNotFoundError:
                    continue  # removed since the listing: flushed to SST files already
                appeared = True
        if appeared:
            os.fsync(self.dir_fd)


def must_list(stamp: tuple[int, int], listed: tuple[int, int] | None, now_ns: int) -> bool:
    """Whether a directory with times ``stamp`` (ctime, mtime) must be listed again when
    it had ``listed`` at the last listing."""
    return stamp != listed or now_ns - max(stamp) < _SETTLED_NS


def serve(wal_dir: str, stdin: int = 0, stdout: int = 1) -> int:
    logs = _LogFiles(wal_dir)
    pending = b""
    while True:
        data = os.read(stdin, 65536)
        if not data:
            return 0
        pending += data
        whole = len(pending) - len(pending) % TICKET_BYTES
        if not whole:
            continue
        ticket = pending[whole - TICKET_BYTES:whole]
        pending = pending[whole:]
        logs.sync()
        os.write(stdout, ticket)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: walsync.py WAL_DIR", file=sys.stderr)
        return 2
    try:
        return serve(argv[0])
    except OSError as exc:
        print(f"walsync: sync of {argv[0]} failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
