"""The broker domain's named types: their stored values, their mapping to the proto enums
(convert.py, the one place), and the layering of the modules BrokerCore is built from."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from services.broker import convert
from services.broker.model import MessageKind, Resolution, Source, TxnState
from services.broker.store import codec
from txmq.errors import InvalidFieldError
from txmq.v1 import common_pb2

BROKER = Path(convert.__file__).parent


def test_stored_values_never_change():
    # One byte each in the txn and log column families: changing one misreads every store.
    assert {s.name: int(s) for s in TxnState} == {"PREPARED": 1, "COMMITTED": 2, "ROLLED_BACK": 3,
                                                  "DISCARDED": 4}
    assert {s.name: int(s) for s in Source} == {"NONE": 0, "CLIENT": 1, "CHECK": 2, "OPERATOR": 3,
                                                "BROKER": 4}
    assert {k.name: int(k) for k in MessageKind} == {"NORMAL": 1, "HALF": 2}
    assert codec.STATE_NAMES == {1: "PREPARED", 2: "COMMITTED", 3: "ROLLED_BACK", 4: "DISCARDED"}


def test_a_transaction_row_keeps_its_state_and_source_through_the_codec():
    row = codec.TxnRow(seq=7, state=TxnState.DISCARDED, producer_group="pg", producer_client_id="c",
                       topic="orders", queue_id=0, message_id="m", prepared_ms=1, next_due_ms=2,
                       body_size=3, source=Source.BROKER)
    back = codec.decode_txn(codec.encode_txn(row), codec.txn_key(7))
    assert (back.state, back.source) == (TxnState.DISCARDED, Source.BROKER)


@pytest.mark.parametrize("state", list(TxnState))
def test_every_state_maps_to_its_proto_enum_and_back(state):
    proto = convert.state_to_proto(state)
    assert common_pb2.TransactionState.Name(proto) == f"TRANSACTION_STATE_{state.name}"
    assert convert.state_from_proto(proto) == state


@pytest.mark.parametrize("source", list(Source))
def test_every_source_maps_to_its_proto_enum(source):
    name = common_pb2.TransactionSource.Name(convert.source_to_proto(source))
    assert name == ("TRANSACTION_SOURCE_UNSPECIFIED" if source == Source.NONE
                    else f"TRANSACTION_SOURCE_{source.name}")


def test_every_proto_resolution_maps_to_the_model():
    names = {v.name for v in common_pb2.TransactionResolution.DESCRIPTOR.values} - {
        "TRANSACTION_RESOLUTION_UNSPECIFIED"}
    assert {common_pb2.TransactionResolution.Name(k): v for k, v in convert.RESOLUTIONS.items()} == {
        f"TRANSACTION_RESOLUTION_{r.name}": r for r in Resolution}
    assert len(names) == len(Resolution)


def test_no_state_is_unspecified_both_ways():
    assert convert.state_to_proto(0) == common_pb2.TRANSACTION_STATE_UNSPECIFIED  # a normal message
    assert convert.state_from_proto(common_pb2.TRANSACTION_STATE_UNSPECIFIED) == 0  # any state
    with pytest.raises(InvalidFieldError, match="state"):
        convert.state_from_proto(99)


def _broker_imports(module: str) -> set[str]:
    tree = ast.parse((BROKER / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
    return found


@pytest.mark.parametrize("part", ["base", "model", "validation", "delivery", "retention", "queries"])
def test_the_parts_of_the_core_import_no_part_above_them(part):
    # base and model are the bottom; the parts sit on them and never on each other or core.
    parts = {"core", "base", "validation", "delivery", "retention", "queries"}
    allowed = {"model": set(), "base": set(), "validation": set()}.get(part, {"base"})
    assert _broker_imports(part) & parts <= allowed, _broker_imports(part)
