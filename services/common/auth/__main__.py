"""Token tools for operators::

    python -m services.common.auth new-token     # a fresh token and the digest to store
    python -m services.common.auth hash-token    # the digest of a token read from stdin
    python -m services.common.auth bootstrap --out DIR [--release R] [--namespace NS]
        [--admin NAME] [--app NAME ...] [--rocketmq-app NAME ...]
                                                 # a deployment's credential files and Secrets
"""

from __future__ import annotations

import sys

from .bootstrap import main as bootstrap
from .bootstrap import new_token
from .store import hash_token


def main(argv: list[str]) -> int:
    if argv[:1] == ["bootstrap"]:
        return bootstrap(argv[1:])
    if argv == ["new-token"]:
        token = new_token()
        sys.stdout.write(f"token:  {token}\ndigest: {hash_token(token)}\n")
        return 0
    if argv == ["hash-token"]:
        token = sys.stdin.read().strip()
        if not token:
            sys.stderr.write("hash-token: no token on stdin\n")
            return 2
        sys.stdout.write(hash_token(token) + "\n")
        return 0
    sys.stderr.write(__doc__ or "")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
