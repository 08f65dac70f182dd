"""Services that cannot start say why in one line on stderr, with the exit status telling a
refused setting (2) from an environment they cannot start in (1), and no traceback unless
logging at DEBUG. Each case is a real process (`python -m services.<name>`), as an operator
starts it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from services.broker.config import BrokerConfig
from services.broker.core import BrokerCore
from services.common.process import child_pythonpath

ROOT = Path(__file__).resolve().parents[2]


def start(module: str, workdir: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    """Runs a service to its exit with only ``settings`` (plus a local host and ephemeral
    ports) in its environment; it is expected to refuse to start."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXMQ_")}
    env.update({"TXMQ_HOST": "127.0.0.1", "TXMQ_PORT": "0", "TXMQ_METRICS_PORT": "0",
                "PYTHONPATH": child_pythonpath(os.environ.get("PYTHONPATH", "")),
                **settings})
    return subprocess.run([sys.executable, "-m", module], env=env, cwd=workdir, capture_output=True, text=True,
                          timeout=60)


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, f"stderr is not one line:\n{proc.stderr}"
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout
    return lines[0]


def test_a_port_out_of_range_is_refused_with_status_2_before_anything_is_opened(tmp_path: Path) -> None:
    data_dir = tmp_path / "store"
    proc = start("services.broker", tmp_path, TXMQ_PORT="99999", TXMQ_DATA_DIR=str(data_dir))
    assert proc.returncode == 2, proc
    assert one_line(proc) == ("broker: bad configuration: port='99999' (from TXMQ_PORT): above the maximum; "
                              "allowed: an integer 0..65535 (0: an ephemeral port)")
    assert proc.stdout == ""
    assert not data_dir.exists()  # refused before the store was opened, so before any bind


def test_an_advertise_address_without_its_port_is_refused_with_status_2(tmp_path: Path) -> None:
    data_dir = tmp_path / "store"
    proc = start("services.broker", tmp_path, TXMQ_ADVERTISE_ADDRESS="broker-0.local", TXMQ_DATA_DIR=str(data_dir))
    assert proc.returncode == 2, proc
    assert "advertise_address must be host:port" in one_line(proc)
    assert not data_dir.exists()  # refused before the store was opened


def test_a_data_dir_that_cannot_be_created_stops_the_broker_with_status_1(tmp_path: Path) -> None:
    proc = start("services.broker", tmp_path, TXMQ_DATA_DIR="/proc/nope")
    assert proc.returncode == 1, proc
    assert one_line(proc) == ("broker: cannot start: data_dir (TXMQ_DATA_DIR): /proc/nope: "
                              "No such file or directory")
    # The traceback is there for whoever asks for DEBUG, in the JSON log on stdout.
    debug = start("services.broker", tmp_path, TXMQ_DATA_DIR="/proc/nope", TXMQ_LOG_LEVEL="DEBUG")
    assert debug.returncode == 1 and len(debug.stderr.splitlines()) == 1
    assert "Traceback" in debug.stdout and "start-up failed" in debug.stdout


@pytest.mark.parametrize("setting", ["TXMQ_PORT", "TXMQ_METRICS_PORT"])
def test_a_port_in_use_stops_the_service_with_status_1(tmp_path: Path, setting: str) -> None:
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = start("services.nameserver", tmp_path, **{setting: str(port)})
    assert proc.returncode == 1, proc
    field = setting.removeprefix("TXMQ_").lower()
    assert one_line(proc) == (f"nameserver: cannot start: {field} ({setting}): "
                              f"port {port} on 127.0.0.1 is already in use")


def test_a_store_of_another_broker_name_stops_the_broker_with_status_1(tmp_path: Path) -> None:
    data_dir = tmp_path / "store"
    BrokerCore(BrokerConfig(data_dir=str(data_dir), broker_name="broker-a", flush="async")).close()
    proc = start("services.broker", tmp_path, TXMQ_DATA_DIR=str(data_dir), TXMQ_BROKER_NAME="broker-b",
                 TXMQ_WAL_PREFILL_BYTES="0")
    assert proc.returncode == 1, proc
    assert one_line(proc) == (f"broker: cannot start: data_dir (TXMQ_DATA_DIR): data dir {data_dir} belongs to "
                              "broker 'broker-a', not 'broker-b'")


def test_help_lists_every_setting_with_its_range_and_exits_0(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "services.checker", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == ""
    text = " ".join(proc.stdout.split())
    assert text.startswith("usage: python -m services.checker [--setting VALUE ...]")
    assert "--lease-seconds SECONDS TXMQ_LEASE_SECONDS; a number 0.001..3600 seconds; default 10." in text
