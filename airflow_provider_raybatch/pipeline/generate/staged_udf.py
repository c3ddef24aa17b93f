"""Staging as rows finish, for an engine stage's UDF: the part shared by the replica that runs its own
engine (:mod:`.engine_actor`) and the one that sends its rows to a warm pool (:mod:`.pooled_stage`).

A mixin, placed before the stage UDF it wraps (``class X(StagesFinishedRows, SomeStageUDF)``): its
``udf`` hands each row to the replica's :class:`~.replica_staging.RowStager` the moment the engine
returns it, and its ``__call__`` stages what is left of a batch before the batch leaves the replica,
then reports the parts staged since the last report on the batch's first row (the driver commits
them without reading each sidecar back). Nothing here imports vLLM or torch: the pooled stage's
replicas never load them.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.pipeline.stage.replica_staging import REPORTED_PARTS, RowStager, flush_rows_for
from airflow_provider_raybatch.shared.json_types import JsonObject, Kwargs, Row

if TYPE_CHECKING:
    from airflow_provider_raybatch.pipeline.stage.parts import PartWriter

#: Marks a row the engine loop staged already (dropped before the row leaves the stage).
STAGED = "__raybatch_staged__"
#: Ray Data LLM's output field: the row's seconds in the engine (vllm_engine_stage.py).
TIME_IN_ENGINE = "time_taken_llm"


class StagesFinishedRows:
    """Stages each row where it finished; call :meth:`_start_staging` in ``__init__``.

    Expects Ray Data LLM's ``StatefulStageUDF`` after it in the class's bases (``udf``, ``__call__``,
    ``IDX_IN_BATCH_COLUMN``, ``data_column``).
    """

    IDX_IN_BATCH_COLUMN: str
    data_column: str
    _stager: RowStager
    _writer: PartWriter

    def _start_staging(
        self,
        staging: Kwargs,
        replica: JsonObject | None = None,
    ) -> None:
        """:param replica: this replica's clock (reporting/timings.py ``replica_clock``), stamped on
        each part it stages so that the run's timings show its start-up; None for a pooled stage."""
        from airflow_provider_raybatch.pipeline.row_steps import stage_engine_rows
        from airflow_provider_raybatch.pipeline.stage.parts import PartWriter

        settings = dict(staging)
        spec = settings.pop("spec")
        writer = PartWriter(**settings)
        writer.replica = replica
        self._writer = writer
        write = functools.partial(stage_engine_rows, spec=spec, parts=writer)
        self._stager = RowStager(write, flush_rows_for(spec.batch_size))

    async def udf(self, batch: list[Row]) -> AsyncIterator[Row]:
        """The engine loop of the UDF after this mixin; each row it finishes goes to the stager at once."""
        by_index = {row[self.IDX_IN_BATCH_COLUMN]: row for row in batch}
        async for output in super().udf(batch):  # type: ignore[misc]  # the stage UDF after this mixin
            self._note_engine_start(output)
            # The row as it leaves the stage (what Ray Data LLM's __call__ builds from the two).
            row = {**by_index[output[self.IDX_IN_BATCH_COLUMN]], **output}
            row.pop(self.IDX_IN_BATCH_COLUMN)
            if self._stager.finished(row):
                await self._stager.flush()
            yield {**output, STAGED: True}

    def _note_engine_start(self, output: Row) -> None:
        """Keep when an engine took this stage's first row: the row's finish less its seconds in the
        engine (Ray Data LLM's ``time_taken_llm``; -1 for a row that failed before it).

        The end of start-up and the start of generating (reporting/timings.py). The first staged part
        marked it before, so a run whose rows fit one batch showed its whole decode as start-up.
        """
        seconds = output.get(TIME_IN_ENGINE)
        if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not 0 <= seconds < math.inf:
            return
        started = time.time() - seconds
        current = self._writer.first_row_in_engine_at
        self._writer.first_row_in_engine_at = started if current is None else min(current, started)

    async def __call__(self, batch: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:  # Any: Ray Data batch.
        async for output in super().__call__(batch):  # type: ignore[misc]  # the stage UDF after this mixin
            rows = output.get(self.data_column) if output else None
            if rows:
                for row in rows:
                    # Rows that came in failed skip the engine loop: staged here, with the batch.
                    if not row.pop(STAGED, False):
                        self._stager.finished(row)
                await self._stager.flush()  # nothing of this batch leaves the replica unstaged
                written = self._stager.take_written()
                if written:  # every part this replica staged reaches the driver once, with some batch
                    rows[0][REPORTED_PARTS] = json.dumps(
                        [{"name": part.name, "sidecar": part.sidecar} for part in written]
                    )
            yield output
