"""``txmq db``: the decisions table of anchored transactions (``txmq.anchored``).

    txmq db schema [--table T] [--resolver-role ROLE]     print the migration (SQL)
    txmq db init   [--dsn DSN | --dsn-file FILE] [--table T] [--resolver-role ROLE]
    txmq db status [--dsn DSN | --dsn-file FILE] [--table T]

The connection string comes from ``--dsn``, ``--dsn-file`` (a secret mounted as a file) or
``$TXMQ_DECISIONS_DSN``; it is never printed. ``init`` is idempotent; with
``--resolver-role`` it also grants that (existing) role what answering checks needs on the
table and nothing else.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable

from ._decisions import DEFAULT_TABLE, count_statement, resolver_grants_sql, schema_sql
from ._errors import InvalidFieldError


def add_db_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    db = commands.add_parser("db", help="the decisions table of anchored transactions").add_subparsers(
        dest="verb", required=True)
    for verb, text in (("schema", "print the migration that creates the decisions table"),
                       ("init", "create the decisions table (idempotent)"),
                       ("status", "decision rows per producer group, with the oldest")):
        p = db.add_parser(verb, parents=[common], help=text)
        p.add_argument("--table", default=DEFAULT_TABLE, help=f"table name (default {DEFAULT_TABLE})")
        if verb != "status":
            p.add_argument("--resolver-role", default="",
                           help="also grant this role SELECT, INSERT, DELETE on the table (nothing else)")
        if verb != "schema":
            p.add_argument("--dsn", default="", help="libpq connection string (default $TXMQ_DECISIONS_DSN)")
            p.add_argument("--dsn-file", default="", help="read the connection string from this file")
        p.set_defaults(db=verb)


def dsn_of(args: argparse.Namespace) -> str:
    if args.dsn_file:
        with open(args.dsn_file) as f:
            return f.read().strip()
    dsn = args.dsn or os.environ.get("TXMQ_DECISIONS_DSN", "")
    if not dsn:
        raise InvalidFieldError("dsn", "give --dsn, --dsn-file or $TXMQ_DECISIONS_DSN")
    return dsn


#: The oldest PostgreSQL the decision protocol runs on: step 5 of DECISIONS.md finds the row
#: its transaction inserted by ``xmin = pg_current_xact_id()::xid`` (13 and later).
MIN_SERVER_VERSION = 130000


def require_server_version(version: int) -> None:
    """Refuses a server older than :data:`MIN_SERVER_VERSION` (``server_version_num``)
    before anything is created, rather than at the first commit."""
    if version < MIN_SERVER_VERSION:
        shown = f"{version // 10000}.{version // 100 % 100}" if version < 100000 else f"{version // 10000}.{version % 10000}"
        raise InvalidFieldError("dsn", f"the server is PostgreSQL {shown}; anchored transactions need "
                                       f"PostgreSQL 13 or later (pg_current_xact_id)")


def run_db(args: argparse.Namespace, out: Callable[[Any, Callable[[], str]], None]) -> None:
    sql = schema_sql(args.table)
    if getattr(args, "resolver_role", ""):
        sql += resolver_grants_sql(args.table, args.resolver_role)
    if args.db == "schema":
        out({"sql": sql}, lambda: sql.rstrip("\n"))
        return
    import psycopg

    with psycopg.connect(dsn_of(args), autocommit=True) as conn:
        if args.db == "init":
            require_server_version(conn.info.server_version)
            conn.execute(sql)
            out({"table": args.table, "created": True}, lambda: f"decisions table {args.table}: ready")
            return
        statement = count_statement(args.table)
        rows = conn.execute(statement.sql).fetchall()
    data = [{"producer_group": g, "decision": d, "rows": n, "oldest_seconds": round(age or 0.0, 3)}
            for g, d, n, age in rows]

    def table() -> str:
        lines = [f"{'GROUP':<32} {'DECISION':<9} {'ROWS':>8} {'OLDEST':>10}"]
        lines += [f"{r['producer_group']:<32} {r['decision']:<9} {r['rows']:>8} {r['oldest_seconds']:>9.1f}s"
                  for r in data]
        return "\n".join(lines) if data else f"decisions table {args.table}: empty"

    out(data, table)
