"""The SDK's architecture as rules over its source (``tests/unit/structure.py``, the checker
the broker's structure test uses): no class over ~350 lines; no module importing a
sibling's private names; no import circles, and none hidden inside functions; the asyncio
modules drive the shared cores, never their sync twins; the SDK never imports the
services (``txmq broker restore`` runs ``python -m services.broker.restore``: what it does
where they are not installed is tests/integration/test_backup.py's); and the
same rules for the pipeline, whose audit ↔ follow circle issue 33 named (the services' are
test_services_structure.py's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.structure import Package

REPO = Path(__file__).resolve().parents[2]
#: The most lines a class of the SDK may have (the generated stubs in txmq.v1 excepted).
MAX_CLASS_LINES = 350
#: The modules an asyncio module may not import: each has an asyncio twin in txmq.aio.
SYNC_TWINS = ("txmq._checks", "txmq._client", "txmq._consumer", "txmq._producer", "txmq._anchored",
              "txmq._admin", "txmq._produce_stream")
#: Imports of a sync twin still allowed, each with its reason.
TWIN_IMPORTS_ALLOWED = {
    ("txmq.aio._stream", "txmq._produce_stream"):
        "the Produce stream's batching constants and direct_call, shared while the perf branch "
        "reworks both streams: they move to a core of their own once it has landed",
}
#: Optional database drivers, imported where they are used (``pip install txmq[psycopg]``;
#: psycopg_pool only when a pool is the decisions' source): the only imports allowed inside
#: functions.
LAZY = ("psycopg", "psycopg_pool", "sqlalchemy")


@pytest.fixture(scope="module")
def sdk() -> Package:
    return Package.load(REPO, "sdk/txmq", "txmq")


def _own(sdk: Package, module: str) -> bool:
    return not module.startswith("txmq.v1")


def test_no_class_of_the_sdk_is_over_the_limit(sdk):
    long = {c.qualname: c.lines for c in sdk.classes if c.lines > MAX_CLASS_LINES and _own(sdk, c.module)}
    assert long == {}


def test_no_module_reads_a_siblings_private_names(sdk):
    """``from ._x import name`` is how the SDK is organised (its modules are private); a
    private *name* of another module (``from ._x import _helper``) is not."""
    private = [(i.module, i.line, i.target, [n for n in i.names if f"{i.target}.{n}" not in sdk.trees])
               for i in sdk.private_imports() if _own(sdk, i.module)]
    assert [p for p in private if p[3]] == []
    assert sdk.private_attribute_reads() == []


def test_no_import_circles(sdk):
    assert sdk.import_cycles() == []


def test_no_imports_hidden_in_functions(sdk):
    hidden = [(i.module, i.line, i.target) for i in sdk.function_imports()
              if i.target.split(".")[0] not in LAZY]
    assert hidden == []


def test_the_sdk_never_imports_the_services(sdk):
    assert [(i.module, i.line, i.target) for i in sdk.imports
            if i.target == "services" or i.target.startswith("services.")] == []


def test_asyncio_modules_drive_the_cores_not_their_sync_twins(sdk):
    wrong = [(i.module, i.target) for i in sdk.imports
             if i.module.startswith("txmq.aio") and sdk.module_of(i.target) in SYNC_TWINS]
    assert [w for w in wrong if w not in TWIN_IMPORTS_ALLOWED] == []
    assert set(TWIN_IMPORTS_ALLOWED) <= set(wrong), "an allowed import went: drop it from the list"


def test_the_sync_drivers_do_not_import_asyncio_modules(sdk):
    """Only the public facades (``txmq.anchored``, ``txmq.decisions``) name both flavours."""
    facades = {"txmq.anchored", "txmq.decisions"}
    wrong = [(i.module, i.line, i.target) for i in sdk.imports
             if i.module.startswith("txmq._") and (i.target.startswith("txmq.aio")) and i.module not in facades]
    assert wrong == []


def test_no_import_circles_in_the_pipeline():
    """The pipeline's audit ↔ follow circle (issue 33) stays out; the services' rules are
    test_services_structure.py's."""
    pipeline = Package.load(REPO, "pipeline/txmq_pipeline", "txmq_pipeline")
    assert pipeline.import_cycles() == []
    assert [(i.module, i.line, i.target) for i in pipeline.function_imports()
            if pipeline.internal(i.target) and pipeline.module_of(i.target) in {
                "txmq_pipeline.audit", "txmq_pipeline.follow"}] == []
