"""Real network partitions for tests: replicas in network namespaces of their own.

A :class:`Network` is one Linux bridge in the test's (root) namespace with the first address
of a private /24 the test owns (``10.77.N.1``), and one namespace per host
(``txmq-<pid>-<k>``) joined to the bridge by a veth pair, its end renamed ``eth0`` and given
``10.77.N.(10+i)``. Services that stay in the root namespace (etcd, the name server, the
checker, the test's clients) listen on the bridge address, so every host reaches them and
they reach every host; replicas started with :func:`Host.exec_prefix` (``ip netns exec``)
bind their namespace address, and that is the address they register and clients dial.

:func:`isolated` cuts one host off from everyone — etcd, the other replicas, the name
server, the checker and the clients — with ``iptables`` DROP rules on its ``eth0`` (both
directions, silently, as a pulled cable or a dead switch port: no reset, no ICMP), and heals
on exit. Its own loopback keeps working.

Addresses: only inside the /24 of a bridge this process made; ``10.77.0.0/16`` as a whole is
routed to a blackhole in the root namespace, so a client still dialling a replica after its
network is gone gets an error here instead of sending a packet off the machine.

Cleanup: :meth:`Network.close` deletes what it made; :func:`cleanup_leftovers` (called at
session start and before every new network) removes namespaces and links that a crashed
test process (a pid no longer alive) left behind, killing what still runs inside them.
Needs root, ``ip`` (iproute2) and ``iptables`` (``make netns-tools`` installs them).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import itertools
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import weakref
from dataclasses import dataclass, field
from typing import Iterator

log = logging.getLogger(__name__)

PREFIX = "txmq"
#: The range every test network is carved from (one /24 per network); all of it blackholed.
SUPERNET = "10.77.0.0/16"
_SUPERNET_BASE = "10.77"
_LOCK_PATH = "/tmp/txmq-netns.lock"
_NS_NAME = re.compile(rf"^{PREFIX}-(\d+)-(\d+)$")
_LINK_NAME = re.compile(r"^tx[bv](\d+)-\d+$")

_counter = itertools.count(1)
_counter_lock = threading.Lock()
#: Which host each service process was started in (for :func:`isolated`).
_HOSTS: "weakref.WeakKeyDictionary[object, Host]" = weakref.WeakKeyDictionary()


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, or ``ip``/``iptables`` missing)."""


def _next() -> int:
    with _counter_lock:
        return next(_counter)


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
    return out


def available() -> str | None:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (`make netns-tools` installs iproute2 and iptables)"
    return None


def _require() -> None:
    problem = available()
    if problem:
        raise NetnsUnavailable(problem)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespaces() -> list[str]:
    out = run("ip", "netns", "list", check=False)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def _links() -> list[str]:
    out = run("ip", "-o", "link", "show", check=False)
    names = []
    for line in out.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return names


def _delete_namespace(name: str) -> None:
    """Kills whatever still runs inside ``name`` (SIGKILL), then deletes it."""
    pids = run("ip", "netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    run("ip", "netns", "del", name, check=False)


def _ensure_blackhole() -> None:
    run("ip", "route", "replace", "blackhole", SUPERNET, "metric", "4000", check=False)


def cleanup_leftovers() -> list[str]:
    """Removes ``txmq-<pid>-*`` namespaces and ``txb<pid>-*``/``txv<pid>-*`` links of test
    processes that are gone (a crash, a SIGKILL). Returns what it removed."""
    if available() is not None:
        return []
    removed = []
    with _locked():
        for ns in _namespaces():
            m = _NS_NAME.match(ns)
            if m and not _pid_alive(int(m.group(1))):
                _delete_namespace(ns)
                removed.append(ns)
        for link in _links():
            m = _LINK_NAME.match(link)
            if m and not _pid_alive(int(m.group(1))):
                run("ip", "link", "del", link, check=False)
                removed.append(link)
    if removed:
        log.warning("removed network namespaces and links left by dead test processes: %s", removed)
    return removed


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One allocation at a time across the test processes of this machine."""
    with open(_LOCK_PATH, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@dataclass(eq=False)
class Host:
    """One network namespace on a :class:`Network`: ``address`` is its ``eth0``."""

    network: "Network"
    namespace: str
    address: str
    outer_link: str
    _active: list[list[str]] | None = None

    @property
    def exec_prefix(self) -> list[str]:
        """Prepend to a command to run it in this namespace."""
        return ["ip", "netns", "exec", self.namespace]

    def _iptables(self, *args: str) -> None:
        run(*self.exec_prefix, "iptables", "-w", *args)

    def _rules(self, client_port: int | None) -> list[list[str]]:
        """The iptables rules of a partition, in insertion order (``-I`` puts the last first):
        drop everything on eth0 except, with ``client_port``, the root namespace's
        connections to that port (its clients' calls and their answers)."""
        rules = [["INPUT", "-i", "eth0", "-j", "DROP"], ["OUTPUT", "-o", "eth0", "-j", "DROP"]]
        if client_port is not None:
            gateway = self.network.gateway
            rules += [["INPUT", "-i", "eth0", "-s", gateway, "-p", "tcp", "--dport", str(client_port), "-j", "ACCEPT"],
                      ["OUTPUT", "-o", "eth0", "-d", gateway, "-p", "tcp", "--sport", str(client_port), "-j", "ACCEPT"]]
        return rules

    def isolate(self, client_port: int | None = None) -> None:
        """Drops every packet in and out of ``eth0``, both directions (loopback still works).
        With ``client_port``, connections from the root namespace (the test's clients, the
        checker) to that port still pass: a minority partition its clients still reach."""
        if self._active is not None:
            raise RuntimeError(f"{self.namespace} is already partitioned")
        rules = self._rules(client_port)
        for rule in rules:
            self._iptables("-I", *rule)
        self._active = rules
        log.info("partitioned %s (%s) off the network%s", self.namespace, self.address,
                 f" (clients still reach port {client_port})" if client_port is not None else "")

    def heal(self) -> None:
        if self._active is None:
            return
        for rule in self._active:
            self._iptables("-D", *rule)
        self._active = None
        log.info("healed the partition of %s (%s)", self.namespace, self.address)

    @property
    def isolated(self) -> bool:
        return self._active is not None


@dataclass(eq=False)
class Network:
    """A bridge with ``gateway`` (the root namespace's address on it) and hosts added on
    demand. Use as a context manager or call :meth:`close`."""

    bridge: str = ""
    subnet: str = ""
    gateway: str = ""
    hosts: list[Host] = field(default_factory=list)
    closed: bool = False

    def __post_init__(self) -> None:
        _require()
        cleanup_leftovers()
        pid = os.getpid()
        with _locked():
            _ensure_blackhole()
            taken = run("ip", "-4", "-o", "addr", "show").stdout
            third = next((n for n in range(1, 255) if f" {_SUPERNET_BASE}.{n}." not in taken), None)
            if third is None:
                raise NetnsUnavailable(f"every /24 of {SUPERNET} is in use on this machine")
            self.subnet = f"{_SUPERNET_BASE}.{third}.0/24"
            self.gateway = f"{_SUPERNET_BASE}.{third}.1"
            self.bridge = f"txb{pid}-{_next()}"
            try:
                run("ip", "link", "add", self.bridge, "type", "bridge")
                run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
                run("ip", "link", "set", self.bridge, "up")
            except BaseException:
                run("ip", "link", "del", self.bridge, check=False)
                raise
        _ALL.add(self)

    def add_host(self) -> Host:
        """A new namespace joined to the bridge, with its own address and loopback up."""
        if self.closed:
            raise RuntimeError("the network is closed")
        if len(self.hosts) >= 200:
            raise RuntimeError("a test network holds at most 200 hosts")
        k = _next()
        namespace = f"{PREFIX}-{os.getpid()}-{k}"
        outer, inner = f"txv{os.getpid()}-{k}", f"txi{os.getpid()}-{k}"
        address = self.gateway.rsplit(".", 1)[0] + f".{10 + len(self.hosts)}"
        host = Host(self, namespace, address, outer)
        self.hosts.append(host)
        run("ip", "netns", "add", namespace)
        run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        run("ip", "link", "set", outer, "master", self.bridge)
        run("ip", "link", "set", outer, "up")
        run("ip", "link", "set", inner, "netns", namespace)
        ns = host.exec_prefix
        run(*ns, "ip", "link", "set", inner, "name", "eth0")
        run(*ns, "ip", "addr", "add", f"{address}/24", "dev", "eth0")
        run(*ns, "ip", "link", "set", "eth0", "up")
        run(*ns, "ip", "link", "set", "lo", "up")
        return host

    def close(self) -> None:
        """Deletes every namespace (killing what still runs inside), veth pair and the bridge."""
        if self.closed:
            return
        self.closed = True
        for host in self.hosts:
            _delete_namespace(host.namespace)
            run("ip", "link", "del", host.outer_link, check=False)
        run("ip", "link", "del", self.bridge, check=False)
        _ALL.discard(self)

    def __enter__(self) -> "Network":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_ALL: "weakref.WeakSet[Network]" = weakref.WeakSet()


def close_all() -> None:
    """Closes every network this process still has (last-resort cleanup)."""
    for network in list(_ALL):
        network.close()


def attach(proc: object, host: Host) -> None:
    """Records that ``proc`` runs in ``host`` (so :func:`isolated` can find its namespace)."""
    _HOSTS[proc] = host


def host_of(proc: object) -> Host:
    host = _HOSTS.get(proc)
    if host is None:
        raise LookupError(f"{proc!r} does not run in a network namespace (start the cluster with netns=True)")
    return host


@contextlib.contextmanager
def isolated(proc: object, *, clients: bool = False) -> Iterator[Host]:
    """Cuts the namespace ``proc`` runs in off from everyone — etcd, the other replicas, the
    name servers, the checker, the clients — for the duration; heals on exit.

    ``clients=True`` keeps one way in: connections from the root namespace to ``proc``'s own
    gRPC port (the test's clients and the checker dialling it) still pass, while everything
    ``proc`` dials itself (etcd, the name servers, the other replicas) and every other host
    dialling it is cut. That is the partition in which a deposed leader could still be asked
    to acknowledge writes."""
    host = host_of(proc)
    host.isolate(int(proc.port) if clients else None)
    try:
        yield host
    finally:
        host.heal()


atexit.register(close_all)
