"""Which producer groups each check stream may still be sent the checks of, decided again
whenever the credential files are reloaded.

A stream is authorized when it subscribes: ``check`` on every group it names, for its
principal (the end principal when the proxy acts for one, ``services.common.auth.delegation``).
Its checks carry the half messages' bodies and properties, so a right revoked later must stop
them on the streams already open, not at the producer's next subscribe. Before each write on a
stream, each request read from one, and every sweep, the checker compares the credential
store's snapshot with the one it last decided under — one comparison while nothing changed —
and once the files were reloaded decides every stream again under the new rules:

- its credentials (token, certificate name; the proxy's, and the end principal it names) must
  still name its principal, or the stream ends UNAUTHENTICATED;
- a group its principal may no longer check (:func:`revoked_groups`) leaves the stream: its
  checks there go back to their brokers for the group's other producers, its answers are
  refused, and a PERMISSION_DENIED naming it is sent on the stream; with no group left the
  stream ends with it (``Dispatcher.revoke``);
- a group the stream subscribed to and lost that way, which its principal may check again
  (:func:`regained_groups`), comes back to it as at a subscribe (``Dispatcher.readmit``): its
  checks reach the stream again within its credit, its answers are taken, without the
  producer subscribing again. The stream is not told (its checks of the group simply come
  again). Nothing else is granted by it: only what the stream subscribed to, for the
  principal whose credentials were just decided again — what a new subscribe would get.
  A stream that lost every group has ended; its producer subscribes again.
"""

from __future__ import annotations

import logging
from typing import Iterable

from txmq.errors import PermissionDeniedError, TxmqError, UnauthenticatedError

from services.common.auth import Caller, CredentialStore
from services.common.auth.acl import CHECK, PRODUCER_GROUP, Rule, allows, describe
from services.common.auth.store import Credentials, Principal

from .dispatcher import Dispatcher
from .streams import ProducerStream

log = logging.getLogger(__name__)


def revoked_groups(rules: tuple[Rule, ...], principal: Principal, groups: Iterable[str]) -> tuple[str, ...]:
    """The groups of ``groups`` whose checks ``principal`` may no longer be sent under
    ``rules`` (none for a service identity, which holds every right)."""
    if principal.service:
        return ()
    return tuple(g for g in groups if not allows(rules, principal.name, CHECK, PRODUCER_GROUP, g))


def regained_groups(rules: tuple[Rule, ...], principal: Principal, lost: Iterable[str]) -> tuple[str, ...]:
    """The groups of ``lost`` (revoked from a stream) that ``principal`` may check again
    under ``rules``."""
    lost = tuple(lost)
    still = set(revoked_groups(rules, principal, lost))
    return tuple(g for g in lost if g not in still)


def refusal(principal: Principal, groups: Iterable[str]) -> PermissionDeniedError:
    """What the stream is told of the groups it lost (naming every one)."""
    return PermissionDeniedError(principal.name, CHECK, ", ".join(describe(PRODUCER_GROUP, g) for g in groups))


class Standing:
    """The streams' callers, and the store snapshot they were last decided under."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        #: The credential store (None until a stream of an authenticated caller subscribed:
        #: auth off, nothing to decide).
        self.store: CredentialStore | None = None
        self._seen: Credentials | None = None
        self._callers: dict[int, tuple[ProducerStream, Caller]] = {}

    def watch(self, stream: ProducerStream, caller: Caller | None) -> None:
        """A stream subscribed by ``caller`` (None: auth off). Decided at once if the files
        were reloaded between its subscribe's check and now."""
        if caller is None:
            return
        self.store = caller.store
        self._callers[stream.id] = (stream, caller)
        if caller.credentials is not self._seen:
            self._decide(stream, caller)

    def forget(self, stream: ProducerStream) -> None:
        self._callers.pop(stream.id, None)

    def revise(self) -> None:
        """Decides every stream again if the credential files were reloaded since the last
        time (the store looks at them at most every ``auth_reload_seconds``)."""
        store = self.store
        if store is None:
            return
        credentials = store.current()
        if credentials is self._seen:
            return
        self._seen = credentials
        for stream, caller in list(self._callers.values()):
            self._decide(stream, caller)

    def _decide(self, stream: ProducerStream, caller: Caller) -> None:
        error: TxmqError
        try:
            credentials = caller.current()
        except (UnauthenticatedError, PermissionDeniedError) as refused:
            lost, error = stream.groups, refused
        else:
            # Brought back first: a stream whose last group goes while another comes back stays.
            back = self.dispatcher.readmit(stream, regained_groups(credentials.rules, caller.principal, stream.lost))
            if back:
                log.info("check stream's rights granted again", extra={"fields": {
                    "client_id": stream.client_id, "stream": stream.id, "principal": caller.principal.name,
                    "groups": list(back)}})
            lost = revoked_groups(credentials.rules, caller.principal, stream.groups)
            if not lost:
                return
            error = refusal(caller.principal, lost)
        handed_back = self.dispatcher.revoke(stream, lost, error)
        log.warning("check stream's rights revoked", extra={"fields": {
            "client_id": stream.client_id, "stream": stream.id, "principal": caller.principal.name,
            "groups": list(lost), "handed_back": handed_back, "ended": stream.closed, "error": error.message}})
