"""A streaming Python data source whose first trigger is held back: its reader's
``initialOffset`` (the first call Spark makes once the source's Python process is up)
returns only once the file named by the ``gate`` option exists. It has the follower's
columns and never has data, so each trigger ends without a batch.

Spark runs the reader in a Python process of its own: the test and it meet through files
(``<gate>.reached`` is written when the reader is waiting at the gate)."""

from __future__ import annotations

import os
import time
from typing import Any, Iterator

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

#: The reader gives up after this long (a test that forgot to open the gate must not leave
#: a Spark query hanging).
GATE_DEADLINE_SECONDS = 300.0

SCHEMA = ("topic STRING, broker STRING, queue INT, offset BIGINT, message_id STRING, transaction_id STRING, "
          "producer_group STRING")


class GatedSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "txmq_test_gated"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _GatedReader(self.options["gate"])


class _GatedReader(DataSourceStreamReader):
    def __init__(self, gate: str) -> None:
        self.gate = gate

    def initialOffset(self) -> dict:
        with open(self.gate + ".reached", "w"):
            pass
        deadline = time.monotonic() + GATE_DEADLINE_SECONDS
        while not os.path.exists(self.gate):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the gate {self.gate} was never opened")
            time.sleep(0.05)
        return {"n": 0}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        return start if start is not None else {"n": 0}  # never any data

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return []

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        return iter(())

    def commit(self, end: dict) -> None:
        pass
