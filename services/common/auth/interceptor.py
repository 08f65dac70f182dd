"""The authentication and authorization interceptor: who is calling (a bearer token, an mTLS
client certificate, or — on the proxy — a RocketMQ signed request), and may they do what the
request asks (``policy``). Every RPC of a service with auth on passes it; the handler runs
only for an allowed call, with its caller in :data:`CALLER`.

Refusals: UNAUTHENTICATED when no principal has the credentials (or none came),
PERMISSION_DENIED for a known principal without the right, each naming what was missing;
RESOURCE_EXHAUSTED for an allowed call beyond its principal's share of the service (``shares``:
its open streams and unary calls in flight, all its connections together; the call is counted
from here, where its principal is known, to its end). The proxy answers them in band
(``refuse``), as the official clients expect.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime
import inspect
import logging
import time
from typing import Any, Callable, Mapping, Protocol

import grpc

from txmq.errors import InvalidFieldError, PermissionDeniedError, ResourceExhaustedError, TxmqError, UnauthenticatedError

from ..errors import abort_with
from .acl import ACTIONS, allows, describe
from .delegation import act_for, effective_principal
from .ownership import Resolve, authorize_ids
from .delegation import reset as reset_acting
from .policy import ANY, INTERNAL, INTERNAL_ACTION, OPEN, Need, Policy
from .store import AccessKey, CredentialStore, Credentials, Principal

log = logging.getLogger(__name__)

#: Decides a call again under a reloaded snapshot (raises the refusal).
Recheck = Callable[[Credentials], None]


class Caller:
    """Who the call being served is for, the store that said so, and the snapshot of its
    files it was last decided under: a call that holds on (a stream, a long poll) is decided
    again when they are reloaded (:meth:`current`), so a revoked credential or right stops it."""

    __slots__ = ("principal", "store", "credentials", "_recheck")

    def __init__(self, principal: Principal, store: CredentialStore, credentials: Credentials | None = None,
                 recheck: Recheck | None = None) -> None:
        #: The principal the call is decided for: the one authenticated, or the end
        #: principal a service identity acts for (``delegation``).
        self.principal = principal
        self.store = store
        self.credentials = credentials if credentials is not None else store.current()
        self._recheck = recheck

    def current(self) -> Credentials:
        """The store's current snapshot, the call decided again first if it is not the one
        the call was last decided under: the credentials the call came with must still name
        its principal (UnauthenticatedError: a token, certificate name or access key removed,
        the principal gone or no longer a service identity), and a call of one request must
        still be allowed it (PermissionDeniedError). While nothing was reloaded, one
        comparison. A refusal stays: every later call raises it again."""
        credentials = self.store.current()
        if credentials is not self.credentials:
            if self._recheck is not None:
                self._recheck(credentials)
            self.credentials = credentials
        return credentials


#: The caller of the call being served (None when auth is off or the method is open).
CALLER: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("txmq_caller", default=None)

SIGNATURE_SCHEME = "MQv2-HMAC-SHA1"
DATE_HEADER = "x-mq-date-time"
#: The stamp's format (RocketMQ's ``yyyyMMdd'T'HHmmss'Z'``).
DATE_FORMAT = "%Y%m%dT%H%M%SZ"
#: Names in a client certificate that identify it (gRPC's auth context keys).
CERTIFICATE_NAME_KEYS = ("x509_common_name", "x509_subject_alternative_name")

#: method, error → the response that refuses in band (the proxy); None: a gRPC status.
Refuse = Callable[[str, TxmqError], Any]


class Held(Protocol):
    """A limit a call was counted against (``services.common.limits.PrincipalLimit``)."""

    def give_back(self, key: str, n: int = 1) -> None: ...


class Shares(Protocol):
    """What an allowed call is counted against once its principal is known
    (``services.common.limits.PrincipalShares``)."""

    def admit(self, full_method: str, streaming: bool, principal: Principal) -> Held | None:
        """Counts the call (raises the refusal: a ``ResourceExhaustedError``); returns the
        limit to give it back to, None when it is not counted."""


def current_principal() -> Principal | None:
    caller = CALLER.get()
    return caller.principal if caller is not None else None


def recheck() -> None:
    """Decides the call being served again if the credential files were reloaded since it
    was (:meth:`Caller.current`; nothing with auth off or for an open method): what a call that
    held on — a long poll that waited, a stream about to write — passes before it hands out
    more. Raises UnauthenticatedError or PermissionDeniedError."""
    caller = CALLER.get()
    if caller is not None:
        caller.current()


def may(action: str, kind: str, name: str) -> bool:
    """Whether the caller of the call being served may do ``action`` on a resource (always,
    with auth off): for what a handler decides beyond the policy table, such as which of a
    producer's topics it may be sent checks for."""
    caller = CALLER.get()
    if caller is None or caller.principal.service:
        return True
    return allows(caller.store.current().rules, caller.principal.name, action, kind, name)


def may_see(kind: str, name: str) -> bool:
    """Whether the caller of the call being served holds any right on a resource (always,
    with auth off): what a listing open to every principal (GetBrokerStats, ListBrokers)
    shows it of the topics and groups it lists. Another tenant's names are not its to learn."""
    return any(may(action, kind, name) for action in ACTIONS)


def _metadata(context: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        out.setdefault(key.lower(), value if isinstance(value, str) else value.decode(errors="replace"))
    return out


def _signature_fields(text: str) -> dict[str, str]:
    fields = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def _offset_text(seconds: float) -> str:
    minutes = round(abs(seconds) / 60)
    return f"{minutes // 60}h{minutes % 60:02d}m {'ahead of' if seconds > 0 else 'behind'}"


def check_fresh(access_key: str, key: AccessKey, stamp: str, max_skew_seconds: float, now: float) -> None:
    """Refuses a signed request whose ``x-mq-date-time`` is more than ``max_skew_seconds``
    from ``now`` (epoch seconds), read in the key's ``time_zone``: a replay of a captured
    signature, or a client whose clock or zone is off. 0 turns the check off."""
    if max_skew_seconds <= 0:
        return
    try:
        local = datetime.datetime.strptime(stamp, DATE_FORMAT)
    except ValueError:
        raise UnauthenticatedError(f"signed request: {DATE_HEADER} {stamp[:40]!r} is not a time like "
                                   "20260102T030405Z") from None
    signed_at = local.replace(tzinfo=key.time_zone).timestamp()
    skew = signed_at - now
    if abs(skew) <= max_skew_seconds:
        return
    hint = ""
    quarters = skew / 900
    if abs(skew) <= 14 * 3600 + max_skew_seconds and abs(quarters - round(quarters)) * 900 <= max_skew_seconds:
        hint = (f"; off by a whole time zone: the official Python and Java clients stamp their host's local "
                f"time, so access key {access_key!r} needs the time_zone of its clients' hosts")
    raise UnauthenticatedError(
        f"signed request: {DATE_HEADER} {stamp} is {_offset_text(skew)} the proxy's clock, more than "
        f"signature_max_skew_seconds={max_skew_seconds:g} (a replayed request, or a client clock that is off){hint}")


def authenticate(credentials: Credentials, context: Any, accept_signatures: bool,
                 max_skew_seconds: float = 0.0) -> Principal:
    metadata = _metadata(context)
    header = metadata.get("authorization", "")
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() == "bearer":
        principal = credentials.principal_for_token(rest.strip())
        if principal is None:
            raise UnauthenticatedError("the bearer token is not known (revoked, mistyped, or from another cluster)")
        return principal
    if scheme == SIGNATURE_SCHEME and accept_signatures:
        fields = _signature_fields(rest)
        access_key = fields.get("Credential", "")
        if access_key:  # the official clients sign with an empty key when none is configured
            if fields.get("SignedHeaders", "").lower() != DATE_HEADER:
                raise UnauthenticatedError(f"signed request: SignedHeaders must be {DATE_HEADER}")
            stamp = metadata.get(DATE_HEADER, "")
            principal = credentials.principal_for_signature(access_key, stamp, fields.get("Signature", ""))
            if principal is None:
                raise UnauthenticatedError(f"signed request: access key {access_key!r} is not known or the "
                                           "signature does not match its secret")
            # Only a genuine signature gets this far: its stamp must be fresh.
            check_fresh(access_key, credentials.access_keys[access_key], stamp, max_skew_seconds, time.time())
            return principal
    elif header and scheme.lower() != "bearer":
        raise UnauthenticatedError(f"authorization scheme {scheme!r} is not accepted here "
                                   f"(use Bearer <token>{' or ' + SIGNATURE_SCHEME if accept_signatures else ''})")
    names: list[str] = []
    auth_context = context.auth_context() or {}
    for key in CERTIFICATE_NAME_KEYS:
        names.extend(v.decode() if isinstance(v, bytes) else v for v in auth_context.get(key, ()))
    if names:
        principal = credentials.principal_for_certificate(names)
        if principal is None:
            raise UnauthenticatedError(f"client certificate {names[0]!r} is not a known principal")
        return principal
    raise UnauthenticatedError("credentials required: an 'authorization: Bearer <token>' header"
                               + (", a signed request" if accept_signatures else "")
                               + " or a client certificate")


def authorize(credentials: Credentials, principal: Principal, method: str, needs: list[Need]) -> None:
    if principal.service:
        return
    for need in needs:
        if INTERNAL_ACTION in need.actions:
            raise PermissionDeniedError(principal.name, "call", f"{method} (for service identities only"
                                        + (f": {need.why})" if need.why else ")"))
        if not any(allows(credentials.rules, principal.name, a, need.kind, need.name) for a in need.actions):
            raise PermissionDeniedError(principal.name, " or ".join(need.actions), describe(need.kind, need.name))


class AuthInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, store: CredentialStore, policies: Mapping[str, Policy],
                 refuse: Refuse | None = None, accept_signatures: bool = False,
                 signature_max_skew_seconds: float = 0.0, acts_for_callers: bool = False,
                 resolve: Resolve | None = None, shares: Shares | None = None) -> None:
        self.store = store
        self.policies = policies
        self.refuse = refuse
        self.accept_signatures = accept_signatures
        self.signature_max_skew_seconds = signature_max_skew_seconds
        #: The proxy: the native calls a handler makes are for its caller (``delegation``).
        self.acts_for_callers = acts_for_callers
        #: The service's lookup of what a request's ids name in its store (``ownership``;
        #: None: a service that holds no records ids name).
        self.resolve = resolve
        #: Each principal's share of the service (None: not counted per principal).
        self.shares = shares
        self._last_log = 0.0
        #: Refusals so far (UNAUTHENTICATED, PERMISSION_DENIED).
        self.refused = {"UNAUTHENTICATED": 0, "PERMISSION_DENIED": 0}

    def _check(self, context: Any, method: str, policy: Policy | None, request: Any) -> Caller | None:
        """The caller if ``request`` (None: a stream's opening) is allowed."""
        if policy is not None and policy.rights == OPEN:
            return None
        credentials = self.store.current()
        principal = self._principal(credentials, context, self.signature_max_skew_seconds)
        self._authorize(credentials, principal, method, policy, request)
        if request is not None and policy is not None and callable(policy.rights):
            self.authorize_ids(credentials, principal, policy, request)

        def recheck(now: Credentials) -> None:
            # The signature's stamp was fresh when the call began: only its key is checked.
            again = self._principal(now, context, 0.0)
            if again != principal:
                raise UnauthenticatedError(f"the credentials of this call no longer name principal "
                                           f"{principal.name!r} (the credential files were reloaded)")
            self._authorize(now, principal, method, policy, request)
        return Caller(principal, self.store, credentials, recheck)

    def _principal(self, credentials: Credentials, context: Any, max_skew_seconds: float) -> Principal:
        principal = authenticate(credentials, context, self.accept_signatures, max_skew_seconds)
        # A service identity acting for an end principal is decided as that principal.
        return effective_principal(credentials, principal, _metadata(context))

    @staticmethod
    def _authorize(credentials: Credentials, principal: Principal, method: str, policy: Policy | None,
                   request: Any) -> None:
        """The names ``request`` carries (None: a stream, whose messages are checked one by one)."""
        if policy is None:
            authorize(credentials, principal, method, [Need((INTERNAL_ACTION,), "cluster", why="no policy")])
        elif policy.rights == INTERNAL:
            authorize(credentials, principal, method, [Need((INTERNAL_ACTION,), "cluster")])
        elif policy.rights != ANY and request is not None:
            assert not isinstance(policy.rights, str), f"{method}: unknown rights {policy.rights!r}"  # the markers are above
            authorize(credentials, principal, method, policy.rights(request))

    def authorize_ids(self, credentials: Credentials, principal: Principal, policy: Policy, request: Any) -> None:
        """What the request's ids name in the store, authorized (after the names it carries)."""
        if policy.ids is not None and self.resolve is not None:
            authorize_ids(credentials.rules, principal, policy.ids(request), self.resolve)

    def _noted(self, method: str, error: TxmqError) -> None:
        self.refused[error.reason] = self.refused.get(error.reason, 0) + 1
        now = time.monotonic()
        if now - self._last_log >= 1.0:  # one line a second at most: refusals are cheap to cause
            self._last_log = now
            log.warning("call refused", extra={"fields": {"method": method, "reason": error.reason,
                                                          "error": error.message, "refused": dict(self.refused)}})

    async def intercept_service(self, continuation: Callable[..., Any],
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        policy = self.policies.get(method)
        short = method.rsplit("/", 1)[-1]
        check = self._check
        refuse = self.refuse
        noted = self._noted
        acts_for_callers = self.acts_for_callers
        shares = self.shares

        def end_principal(principal: Principal | None) -> str | None:
            """Whom this handler's native calls are for (the proxy: its caller)."""
            if not acts_for_callers or principal is None or principal.service:
                return None
            return principal.name

        async def refused(context: Any, error: TxmqError) -> Any:
            noted(method, error)
            if refuse is not None:
                return refuse(short, error)
            await abort_with(context, error)

        def checked_requests(iterator: Any, guard: "_StreamGuard") -> Any:
            async def gen() -> Any:
                async for message in iterator:
                    await guard.check(message)
                    yield message
            return gen()

        def prepare(request: Any, context: Any, caller: Caller | None, streamed: bool) -> tuple[Any, Any]:
            """The handler's arguments: a stream of requests whose every message is checked
            when the policy says so (through the iterator and ``context.read()`` alike)."""
            if not streamed or caller is None or policy is None or not callable(policy.rights):
                return request, context
            guard = _StreamGuard(self, method, policy, context, caller)
            return checked_requests(request, guard), _CheckedContext(context, guard)

        def wrap(behavior: Callable[..., Any], streamed: bool, streaming_response: bool) -> Callable[..., Any]:
            """The handler behind the check: ``streamed`` requests are checked as they come
            (the opening only authenticates), a single request before the handler runs."""
            streaming = streamed or streaming_response

            def admit(caller: Caller | None) -> Held | None:
                """The call counted against its principal's share (raises the refusal)."""
                if shares is None or caller is None:
                    return None
                return shares.admit(method, streaming, caller.principal)

            if streaming_response and inspect.isasyncgenfunction(behavior):
                async def gen_wrapper(request: Any, context: Any) -> Any:
                    try:
                        caller = check(context, method, policy, None if streamed else request)
                        held = admit(caller)
                    except (UnauthenticatedError, PermissionDeniedError, InvalidFieldError,
                            ResourceExhaustedError) as error:
                        answer = await refused(context, error)
                        if answer is not None:
                            yield answer
                        return
                    token = CALLER.set(caller)
                    acting = act_for(end_principal(caller.principal if caller else None))
                    args = prepare(request, context, caller, streamed)
                    try:
                        async for item in behavior(*args):
                            yield item
                    except asyncio.CancelledError:
                        await _StreamGuard.refuse_if_violated(args[1])
                        raise
                    finally:
                        if held is not None:
                            held.give_back(caller.principal.name)  # type: ignore[union-attr]  # held: a caller
                        reset_acting(acting)
                        CALLER.reset(token)
                return gen_wrapper

            async def wrapper(request: Any, context: Any) -> Any:
                try:
                    caller = check(context, method, policy, None if streamed else request)
                    held = admit(caller)
                except (UnauthenticatedError, PermissionDeniedError, InvalidFieldError, ResourceExhaustedError) as error:
                    answer = await refused(context, error)
                    if answer is not None and streaming_response:
                        await context.write(answer)
                        return None
                    return answer
                token = CALLER.set(caller)
                acting = act_for(end_principal(caller.principal if caller else None))
                args = prepare(request, context, caller, streamed)
                try:
                    return await behavior(*args)
                except asyncio.CancelledError:
                    await _StreamGuard.refuse_if_violated(args[1])
                    raise
                finally:
                    if held is not None:
                        held.give_back(caller.principal.name)  # type: ignore[union-attr]  # held: a caller
                    reset_acting(acting)
                    CALLER.reset(token)
            return wrapper

        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                wrap(handler.unary_unary, False, False), handler.request_deserializer, handler.response_serializer)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                wrap(handler.unary_stream, False, True), handler.request_deserializer, handler.response_serializer)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                wrap(handler.stream_unary, True, False), handler.request_deserializer, handler.response_serializer)
        if handler.stream_stream:
            return grpc.stream_stream_rpc_method_handler(
                wrap(handler.stream_stream, True, True), handler.request_deserializer, handler.response_serializer)
        return handler


class _StreamGuard:
    """Checks each message of one stream (an ``in_band`` need its first message was granted
    is left to the handler: ``Need.in_band``). A message refused while the handler reads in a
    task of its own (the checker and the broker do) cannot end the call from there: the
    guard cancels the handler's task, whose wrapper then answers PERMISSION_DENIED.

    Never in the middle of a write: a write cancelled half-way leaves its operation on the
    call, the refusal's status then fails to start (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS),
    and the caller hears nothing until its deadline. A refusal that comes while the
    handler writes ends the handler once the write is done (``_CheckedContext.write``)."""

    def __init__(self, interceptor: AuthInterceptor, method: str, policy: Policy, context: Any,
                 caller: Caller) -> None:
        self.interceptor = interceptor
        self.method = method
        self.policy = policy
        assert not isinstance(policy.rights, str), "a stream guard needs a rights function"  # prepare() checks
        self.rights = policy.rights
        self.context = context
        self.caller = caller
        self.principal = caller.principal
        self.task = asyncio.current_task()
        self.violation: UnauthenticatedError | PermissionDeniedError | None = None
        #: The rights the stream's first message was granted (None: none read yet): an
        #: ``in_band`` need among them is the handler's to refuse (``Need.in_band``).
        self.opening: frozenset[tuple[tuple[str, ...], str, str]] | None = None
        #: The handler's write under way, if any, and whether a refusal waits for it.
        self.writing = False
        self.stop_after_write = False

    async def check(self, message: Any) -> None:
        try:
            # Under the current rules; the stream's credentials again first once they changed.
            credentials = self.caller.current()
            needs = self.rights(message)
            if self.opening is None:
                authorize(credentials, self.principal, self.method, needs)
                self.opening = frozenset((n.actions, n.kind, n.name) for n in needs)
            else:
                authorize(credentials, self.principal, self.method,
                          [n for n in needs if not (n.in_band and (n.actions, n.kind, n.name) in self.opening)])
            self.interceptor.authorize_ids(credentials, self.principal, self.policy, message)
        except (UnauthenticatedError, PermissionDeniedError) as error:
            self.interceptor._noted(self.method, error)
            self.violation = error
            if self.task is not None and asyncio.current_task() is not self.task:
                if self.writing:
                    self.stop_after_write = True
                else:
                    self.task.cancel()
                raise asyncio.CancelledError from None
            await abort_with(self.context, error)

    @staticmethod
    async def refuse_if_violated(context: Any) -> None:
        guard = getattr(context, "guard", None)
        if isinstance(guard, _StreamGuard) and guard.violation is not None:
            await abort_with(guard.context, guard.violation)


class _CheckedContext:
    """The servicer context of a stream whose every message is checked: handlers that read
    with ``context.read()`` instead of the request iterator are held to the same policy."""

    def __init__(self, context: Any, guard: _StreamGuard) -> None:
        self._context = context
        self.guard = guard

    async def read(self) -> Any:
        message = await self._context.read()
        if message is not grpc.aio.EOF:
            await self.guard.check(message)
        return message

    async def write(self, message: Any) -> None:
        guard = self.guard
        guard.writing = True
        try:
            await self._context.write(message)
        finally:
            guard.writing = False
        if guard.stop_after_write:
            guard.stop_after_write = False
            if asyncio.current_task() is guard.task:
                raise asyncio.CancelledError
            if guard.task is not None:
                guard.task.cancel()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)
