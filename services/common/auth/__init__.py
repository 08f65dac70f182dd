"""Authentication and authorization: the credential store (:mod:`.store`), the ACL
(:mod:`.acl`), what each RPC needs (:mod:`.policy`), the one interceptor that enforces it
(:mod:`.interceptor`) and the services' own credentials on their calls (:mod:`.client`).

Off unless ``auth_files`` is set (the embedded default); see README "Security"."""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import StartupError
from .client import TokenFile, bearer_interceptors
from .delegation import ON_BEHALF_OF_HEADER, act_for, acting_for, on_behalf_interceptors
from .interceptor import CALLER, AuthInterceptor, Caller, Refuse, Shares, current_principal, may, may_see, recheck
from .ownership import Resolve
from .policy import NATIVE, Policy
from .store import CredentialsError, CredentialStore, hash_token

__all__ = ["CALLER", "AuthInterceptor", "Caller", "CredentialStore", "CredentialsError", "NATIVE",
           "ON_BEHALF_OF_HEADER", "Policy", "Shares", "TokenFile", "act_for", "acting_for", "bearer_interceptors",
           "current_principal", "hash_token", "may", "may_see", "on_behalf_interceptors", "recheck",
           "server_interceptor", "service_credentials"]


def server_interceptor(config: Any, policies: Mapping[str, Policy] | None = None,
                       refuse: Refuse | None = None, accept_signatures: bool = False,
                       acts_for_callers: bool = False, resolve: Resolve | None = None,
                       shares: Shares | None = None) -> AuthInterceptor | None:
    """The service's auth interceptor, or None when ``config.auth_files`` is empty;
    ``acts_for_callers`` (the proxy): its handlers' native calls are for their caller;
    ``resolve`` (the broker): what a request's ids name in its store (``ownership``);
    ``shares``: each principal's share of the service, counted once the call is allowed."""
    if not config.auth_files:
        return None
    try:
        store = CredentialStore(config.auth_files, config.auth_reload_seconds)
    except CredentialsError as exc:
        raise StartupError(f"auth_files (TXMQ_AUTH_FILES): {exc}") from exc
    return AuthInterceptor(store, NATIVE if policies is None else policies, refuse, accept_signatures,
                           getattr(config, "signature_max_skew_seconds", 0.0), acts_for_callers, resolve, shares)


def service_credentials(config: Any) -> list[Any]:
    """Client interceptors carrying this service's token (none without ``auth_token_file``)
    and the end principal it acts for (``delegation``: only the proxy sets one)."""
    if not config.auth_token_file:
        return on_behalf_interceptors()
    try:
        source = TokenFile(config.auth_token_file, config.auth_reload_seconds)
    except (OSError, ValueError) as exc:
        raise StartupError(f"auth_token_file (TXMQ_AUTH_TOKEN_FILE): {exc}") from exc
    return bearer_interceptors(source.token) + on_behalf_interceptors()
