"""``python -m txmq``: the ``txmq`` command line (see ``txmq._cli``)."""

from ._cli import main

if __name__ == "__main__":
    raise SystemExit(main())
