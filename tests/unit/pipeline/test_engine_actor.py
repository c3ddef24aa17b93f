"""pipeline/generate/engine_actor.py: the replica stages each row as the engine finishes it, every row once.

Runs Ray Data LLM's own ``__call__`` (in a fresh interpreter of the cluster's environment, where
vLLM's stage module imports) around our ``udf`` and ``__call__``; only the engine loop is replaced,
by one that finishes a batch's rows in reverse order.
"""

from __future__ import annotations

import json

import pytest

from tests.unit.pipeline.ray_env import part_report, run_parts_in_ray_env

_FINAL_ONLY = """
from vllm import PoolingParams, SamplingParams
from airflow_provider_raybatch.pipeline.generate.engine_actor import _final_output_only
one, several, pooling = SamplingParams(max_tokens=4), SamplingParams(n=3), PoolingParams()
for params in (one, several, pooling):
    _final_output_only(params)
part_done([one.output_kind.name, several.output_kind.name, pooling == PoolingParams()])
"""

_RUN = """
import asyncio, json, types
from ray.llm._internal.batch.stages.vllm_engine_stage import vLLMEngineStageUDF
from airflow_provider_raybatch.pipeline.generate import engine_actor
from airflow_provider_raybatch.pipeline.stage.replica_staging import RowStager

async def engine_loop(self, rows):  # Ray Data LLM's loop yields rows as the engine finishes them
    for row in reversed(rows):
        index = row[self.IDX_IN_BATCH_COLUMN]
        yield {self.IDX_IN_BATCH_COLUMN: index, "generated_text": "out " + row["source"]}

vLLMEngineStageUDF.udf = engine_loop
parts = []
udf = object.__new__(engine_actor.RaybatchvLLMEngineStageUDF)
udf.data_column, udf.expected_input_keys = "__data", set()
def write(rows):  # stages a part and returns it, as stage_engine_rows does
    parts.append([(row["source"], row.get("generated_text")) for row in rows])
    sidecar = {"sources": [row["source"] for row in rows]}
    return types.SimpleNamespace(name=f"part-{len(parts)}", sidecar=sidecar)

udf._stager = RowStager(write, 2)

async def batch(sources, failed=()):
    data = [{"source": s, "__inference_error__": "bad row" if s in failed else ""} for s in sources]
    return [output async for output in udf(({"__data": data}))]

async def main():
    a, b = await asyncio.gather(batch(["a:1", "a:2", "a:3"]), batch(["b:1", "b:2"], failed=("b:1",)))
    yielded = [[{k: v for k, v in r.items()} for r in out["__data"]] for out in (a[0], b[0])]
    return {"parts": parts, "yielded": yielded}

part_done(asyncio.run(main()))
"""


@pytest.fixture(scope="module")
def snippets() -> dict:
    """Both snippets in one interpreter: each imports vLLM (and torch), ~10 s of CPU."""
    return run_parts_in_ray_env({"run": _RUN, "final_only": _FINAL_ONLY})


def test_each_row_is_staged_once_as_it_finishes_and_the_batch_leaves_unchanged(snippets: dict) -> None:
    report = part_report(snippets, "run")

    # Every row once, as the engine finished them: batch a's first two make a part at once (half of
    # a batch of 4); b's row, b's row that came in failed (staged when b ends) and a's last row
    # gathered while that part was being written, and went out together in the next.
    assert report["parts"] == [
        [["a:3", "out a:3"], ["a:2", "out a:2"]],
        [["b:2", "out b:2"], ["b:1", None], ["a:1", "out a:1"]],
    ]
    a, b = report["yielded"]
    # Downstream gets the batch in its own order, without our marker.
    assert [row["source"] for row in a] == ["a:1", "a:2", "a:3"] and [row["source"] for row in b] == [
        "b:1",
        "b:2",
    ]
    assert all("__raybatch_staged__" not in row for row in a + b)
    assert a[0]["generated_text"] == "out a:1" and b[0]["__inference_error__"] == "bad row"
    # Each part staged reaches the driver once, with the first row of a batch that ended after it.
    reported = [json.loads(row["__raybatch_parts__"]) for row in a + b if row.get("__raybatch_parts__")]
    assert all(not row.get("__raybatch_parts__") for row in a[1:] + b[1:])
    names = [part["name"] for report_ in reported for part in report_]
    assert sorted(names) == ["part-1", "part-2"]
    by_name = {part["name"]: part["sidecar"]["sources"] for report_ in reported for part in report_}
    assert by_name == {"part-1": ["a:3", "a:2"], "part-2": ["b:2", "b:1", "a:1"]}


def test_the_engine_returns_each_generation_once_when_it_ends(snippets: dict) -> None:
    """Ray Data LLM reads only a request's final output, yet asked for vLLM's default stream: one output
    per generated token, each a copy of the text so far, in the one process that feeds the engine.
    Every generation request is final-only now, as LLM.generate's; pooling requests are left alone."""
    out = part_report(snippets, "final_only")
    assert out == ["FINAL_ONLY", "FINAL_ONLY", True]  # the pooling request untouched
