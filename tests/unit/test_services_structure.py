"""The rules of ``test_broker_structure.py`` over every service (``services/``): no import
circles, none hidden inside functions, no module reading a sibling's private names, no class
over ~350 lines. Issue 33 found two circles in services/common hidden by function-level
imports (config ↔ tls, auth ↔ runtime); these rules keep them out."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.structure import Package

REPO = Path(__file__).resolve().parents[2]
#: The broker's and the SDK's limit (the proxy's MessagingServicer gave its consumers' RPCs to
#: consumerrpc.ConsumerRpc; the checker's Dispatcher its streams' membership, group credit and
#: reports to streams.Membership, credit.GroupCredit and reports.CheckReports).
MAX_CLASS_LINES = 350
#: Imports a function may make, each with why: optional dependencies a deployment may lack.
IMPORTED_LATE = {
    ("services.checker.resolver", "psycopg"): "only a checker serving resolver groups needs PostgreSQL's driver",
}


@pytest.fixture(scope="module")
def services() -> Package:
    return Package.load(REPO, "services", "services")


def test_no_import_circles(services):
    assert services.import_cycles() == []


def test_no_imports_hidden_in_functions(services):
    hidden = {(i.module, i.target) for i in services.function_imports()}
    assert hidden - set(IMPORTED_LATE) == set()
    assert set(IMPORTED_LATE) <= hidden, "an allowed late import went: drop it from the list"


def test_no_module_reads_a_siblings_private_names(services):
    assert [(i.module, i.line, i.target, i.names) for i in services.private_imports()] == []


def test_no_class_is_over_the_limit(services):
    assert {c.qualname: c.lines for c in services.classes if c.lines > MAX_CLASS_LINES} == {}
