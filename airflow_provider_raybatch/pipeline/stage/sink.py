"""A Ray Data sink that stages result rows as parts (:mod:`.parts`): one part per block.

The engine replicas stage the rows they finish themselves (:mod:`.engine_actor`); this sink writes
the rows that never reach the engine (rejected before it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ray.data import Datasink
from ray.data.block import BlockAccessor

from airflow_provider_raybatch.pipeline.stage.commit import StagedPart
from airflow_provider_raybatch.pipeline.stage.parts import PartWriter
from airflow_provider_raybatch.shared.json_types import JsonObject

if TYPE_CHECKING:
    import pyarrow as pa
    from ray.data._internal.execution.interfaces import TaskContext
    from ray.data.block import Block
    from ray.data.datasource.datasink import WriteResult


class StagedPartsSink(Datasink[list[dict[str, Any]]]):
    """Write result rows (``source``, ``ok``, ``record``) into a run's staging folder, a part per block.

    Each write task returns the parts it staged; once the write is complete, :attr:`written` holds
    them all, so that commit need not read their sidecars back.
    """

    def __init__(self, parts: PartWriter) -> None:
        self.parts = parts
        self.written: list[StagedPart] = []

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        self.parts.create_folders()

    def write(self, blocks: Iterable[Block], ctx: TaskContext) -> list[JsonObject]:
        written = []
        for block in blocks:
            rows = BlockAccessor.for_block(block).to_arrow().to_pylist()
            if rows:  # cut by what their lines cost read back (rejected rows quote their input)
                written += [
                    {"name": part.name, "sidecar": part.sidecar} for part in self.parts.write_parts(rows)
                ]
        return written

    def on_write_complete(self, write_result: WriteResult) -> None:
        self.written = [StagedPart(**part) for parts in write_result.write_returns for part in parts]
