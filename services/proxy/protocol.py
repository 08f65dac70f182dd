"""The ``apache.rocketmq.v2`` protocol definitions, as generated modules.

They come from the official ``rocketmq-python-client`` package (pinned in
requirements/proxy.txt), built from apache/rocketmq-apis tag v2.1.2; no upstream .proto is
copied into this repository. That package's ``__init__`` configures a log file under
``$HOME/logs`` and imports the whole client (OpenTelemetry included); the proxy needs only
the generated code, so it loads ``rocketmq.grpc_protocol`` under a bare parent package and
the client never runs in the proxy process (its root filesystem can stay read-only).

Do not import the official client in a process that imports this module first: it would
find the bare parent. Tests run the official clients in subprocesses (the package also
clashes in protobuf's descriptor pool with any other copy of ``apache.rocketmq.v2``).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import TYPE_CHECKING


def _load() -> tuple[types.ModuleType, types.ModuleType, types.ModuleType]:
    if "rocketmq" not in sys.modules:
        spec = importlib.util.find_spec("rocketmq")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("the proxy needs the rocketmq-python-client package "
                              "(pip install -r requirements/proxy.txt)")
        parent = types.ModuleType("rocketmq")
        parent.__path__ = list(spec.submodule_search_locations)
        parent.__spec__ = spec
        sys.modules["rocketmq"] = parent
    return (importlib.import_module("rocketmq.grpc_protocol.definition_pb2"),
            importlib.import_module("rocketmq.grpc_protocol.service_pb2"),
            importlib.import_module("rocketmq.grpc_protocol.service_pb2_grpc"))


if TYPE_CHECKING:  # untyped generated modules: Any to mypy (pyproject.toml), loaded by _load()
    from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc
else:
    definition_pb2, service_pb2, service_pb2_grpc = _load()

SERVICE_NAME = service_pb2.DESCRIPTOR.services_by_name["MessagingService"].full_name

Code = definition_pb2.Code
