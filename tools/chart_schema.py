"""Writes each service setting's declared range (services/*/config.py) into the chart's
``values.schema.json``, so helm refuses at install what the service would refuse at start.

    python -m tools.chart_schema          # rewrite deploy/helm/txmq/values.schema.json
    python -m tools.chart_schema --check  # exit 1 when the file differs (what the test checks)

Only the ``<component>.config`` properties the schema already lists are touched (the chart
owns the others: ports, names, addresses, paths).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import typing
from pathlib import Path
from typing import Any

from services.common.config import accepts_of

SCHEMA = Path(__file__).resolve().parents[1] / "deploy" / "helm" / "txmq" / "values.schema.json"
#: The chart's components and their configuration classes.
CONFIG_CLASSES = {
    "nameserver": ("services.nameserver.config", "NameServerConfig"),
    "broker": ("services.broker.config", "BrokerConfig"),
    "checker": ("services.checker.config", "CheckerConfig"),
    "proxy": ("services.proxy.config", "ProxyConfig"),
}


def config_class(component: str) -> type:
    module, name = CONFIG_CLASSES[component]
    return getattr(importlib.import_module(module), name)


def declared_schema(cls: type, name: str) -> dict[str, Any] | None:
    """The JSON Schema of field ``name`` as its declaration says, or None (no declaration)."""
    accepts = accepts_of(cls, name)
    if accepts is None:
        return None
    return accepts.json_schema(typing.get_type_hints(cls)[name])


def updated(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every declared setting's property replaced by its declaration."""
    out = json.loads(json.dumps(schema))
    for component in CONFIG_CLASSES:
        cls = config_class(component)
        properties = out["properties"][component]["properties"]["config"]["properties"]
        for name in properties:
            declared = declared_schema(cls, name)
            if declared is not None:
                properties[name] = declared
    return out


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the file is up to date")
    args = parser.parse_args(argv)
    text = SCHEMA.read_text()
    new = render(updated(json.loads(text)))
    if args.check:
        if new != text:
            print(f"{SCHEMA} differs from the declared ranges: run python -m tools.chart_schema", file=sys.stderr)
            return 1
        return 0
    SCHEMA.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
