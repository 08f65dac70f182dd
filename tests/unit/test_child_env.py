"""What a service process started by ``services.common.process`` imports: this checkout's
code, whatever the parent's working directory."""

from __future__ import annotations

import os
from pathlib import Path

from services.common import process
from services.common.process import child_pythonpath

#: The checkout that holds ``services`` (every child gets it first).
ROOT = str(Path(process.__file__).resolve().parents[2])


def test_relative_entries_reach_the_child_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    entries = child_pythonpath(os.pathsep.join(["sdk", ".", "", "/opt/x", "sdk"])).split(os.pathsep)
    # The child runs in its work directory: "sdk" there named nothing, and the child imported
    # another checkout's txmq through the virtualenv's editable install.
    assert entries == [ROOT, str(tmp_path / "sdk"), str(tmp_path), "/opt/x"]
    assert child_pythonpath("") == ROOT
