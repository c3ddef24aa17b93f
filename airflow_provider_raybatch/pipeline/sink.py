"""A Ray Data sink that stages result rows as parts (:mod:`.parts`): one part per block.

The engine replicas stage the rows they finish themselves (:mod:`.engine_actor`); this sink writes
the rows that never reach the engine (rejected before it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ray.data import Datasink
from ray.data.block import BlockAccessor

from airflow_provider_raybatch.pipeline.parts import PartWriter


class StagedPartsSink(Datasink[None]):
    """Write result rows (``source``, ``ok``, ``record``) into a run's staging folder, a part per block."""

    def __init__(self, parts: PartWriter) -> None:
        self.parts = parts

    def on_write_start(self, schema: Any = None) -> None:  # Any: pyarrow schema or None.
        self.parts.create_folders()

    def write(self, blocks: Iterable[Any], ctx: Any) -> None:  # Any: Ray blocks and TaskContext.
        for block in blocks:
            rows = BlockAccessor.for_block(block).to_arrow().to_pylist()
            if rows:
                self.parts.write_part(rows)
