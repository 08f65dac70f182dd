"""``python -m services.<name> --help`` run as a process (moved from tests/unit/test_config.py:
the unit tier starts no process)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("service", ["nameserver", "broker", "checker", "proxy"])
def test_help_documents_every_field(service):
    """``python -m services.<name> --help`` shows each field's variable, type, default and
    documentation (the ``#:`` comment above it in config.py): none is left undocumented."""
    import dataclasses
    import importlib
    import os
    import subprocess
    import sys

    from services.common.config import env_name, field_docs
    from services.common.process import child_pythonpath

    module = importlib.import_module(f"services.{service}.config")
    cls = next(v for k, v in vars(module).items()
               if k.endswith("Config") and dataclasses.is_dataclass(v) and v.__module__ == module.__name__)
    docs = field_docs(cls)
    undocumented = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
    assert undocumented == []
    # No settings in its environment; the code it runs is this checkout's (its PYTHONPATH).
    shown = subprocess.run([sys.executable, "-m", f"services.{service}", "--help"], capture_output=True, text=True,
                           env={"COLUMNS": "1000", "PATH": "",
                                "PYTHONPATH": child_pythonpath(os.environ.get("PYTHONPATH", ""))}, timeout=60)
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    for field in dataclasses.fields(cls):
        entry = text.split(f"--{field.name.replace('_', '-')} ", 1)[1].split(" --", 1)[0]
        doc = " ".join(docs[field.name].split())[:30]
        assert env_name(field.name) in entry and "default" in entry and doc in entry, (field.name, entry)
