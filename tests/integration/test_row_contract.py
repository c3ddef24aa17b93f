"""Ray Data LLM's public example row functions, pasted unchanged, on a drift corpus and on images:
real Airflow (`airflow dags test`, deferred), the local Ray cluster, vLLM's CPU engine, the tiny
Llama and the tiny VLM. tests/integration/dags/raybatch_notebook_rows.py is the DAG.

The corpus drifts as real exports do: a column that is text on most rows, an object, a number or a
bool on others, nested values, huge integers, unicode and control characters, rows without the
column the preprocess reads, ids of every JSON type, a repeated id, a malformed line and bad UTF-8.
Every line ends in exactly one of outputs and errors, each failure with its reason.
"""

from __future__ import annotations

import base64
import io
import json
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import CPU_ENGINE_KWARGS, CPU_REPLICA, ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

DAG_ID = "raybatch_notebook_rows"
DAGS = ROOT / "tests" / "integration" / "dags"
sys.path.insert(0, str(DAGS))
import ray_data_llm_examples as examples  # noqa: E402

GOOD = 40


def write_drift_corpus(path: Path) -> dict[str, str]:
    """GOOD good rows (drifting types) and bad ones; returns {error row id: expected reason kind}."""
    companies = [
        "Acme Legal",
        {"nested": {"name": "Saint Mary"}},
        12345678901234567890123,
        True,
        "Shöp\u2028co \x07",
        ["a", 1, None],
        3.5,
        "日本語の会社",
    ]
    lines = []
    for i in range(GOOD):
        row = {"Customer Id": f"C{i:03d}" if i % 5 else i, "Company": companies[i % len(companies)]}
        if i % 3 == 0:
            row["Notes"] = {"tags": ["x"] * (i % 4), "score": i / 7} if i % 2 else "plain text"
        lines.append(json.dumps(row, ensure_ascii=False))
    bad = [
        json.dumps({"Customer Id": "C-nocompany", "Country": "FR"}),  # the preprocess reads row["Company"]
        json.dumps({"Customer Id": "C001", "Company": "a repeated id"}),  # duplicate of line 2
        json.dumps({"Customer Id": {"an": "object"}, "Company": "x"}),  # an id that is an object
        '{"Customer Id": "C-broken", "Company": ',  # malformed JSON
    ]
    data = ("\n".join(lines + bad) + "\n").encode() + b'{"Customer Id": "C-utf8", "Company": "\xff"}\n'
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {
        "C-nocompany": "preprocess failed",
        "C001": "duplicate id",
        f"companies.jsonl:{GOOD + 3}": "bad id",
        f"companies.jsonl:{GOOD + 4}": "malformed JSON",
        f"companies.jsonl:{GOOD + 5}": "invalid UTF-8",
    }


def write_items(path: Path, count: int = 20) -> None:
    """The quickstart's ``item`` column, with a ``meta`` column that drifts from row to row."""
    metas = [None, 1, "two", {"three": [3]}, [4.5, "four"], 2**70]
    rows = [{"item": f"Topic number {i}", "meta": metas[i % len(metas)]} for i in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def write_images(folder: Path) -> None:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, color in enumerate(["red", "green", "blue"]):
        Image.new("RGB", (96, 80), color).save(folder / f"img{i}.png")
        rows.append({"name": f"img{i}", "image": f"img{i}.png"})  # a path relative to the JSONL
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), "white").save(buffer, format="JPEG")
    rows.append(
        {"name": "inline", "image": "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()}
    )
    rows.append({"name": "gone", "image": "missing.png"})
    (folder / "images.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_ray_data_llm_examples_on_drift_and_images(airflow_env, tiny_model, tiny_vlm, tmp_path) -> None:
    expected_errors = write_drift_corpus(tmp_path / "drift" / "companies.jsonl")
    write_items(tmp_path / "drift" / "items.jsonl")
    write_images(tmp_path / "images")
    conf = {
        "model": str(tiny_model),
        "vlm": str(tiny_vlm),
        "data_root": str(tmp_path),
        "engine_kwargs": CPU_ENGINE_KWARGS,
        "vlm_engine_kwargs": {**CPU_ENGINE_KWARGS, "limit_mm_per_prompt": {"image": 1}},
        "replica_resources": CPU_REPLICA,
    }
    env = airflow_env.with_env(AIRFLOW__CORE__DAGS_FOLDER=str(DAGS))
    result = env.dags_test(DAG_ID, "2026-11-20", conf, timeout=1100)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-6000:]
    for task in ("industry", "haiku", "vision"):
        assert f"task_id={task}" in log and "state=success" in log, log[-6000:]
    # A run that succeeds logs no error-level line.
    assert not [line for line in log.splitlines() if "[error" in line.lower() or " ERROR " in line], log[
        -6000:
    ]

    rows_in = GOOD + len(expected_errors)
    industry = json.loads((tmp_path / "out" / "industry" / "manifest.json").read_text())
    assert (industry["rows_in"], industry["rows_out"], industry["rows_failed"]) == (
        rows_in,
        GOOD,
        len(expected_errors),
    )
    assert industry["errors_by_reason"] == dict(Counter(expected_errors.values()))
    outputs = pq.read_table(industry["outputs_uri"]).to_pylist()
    # The per-row choice reached the engine (a random-weight model says a label only when constrained),
    # over the operator's max_tokens=2, which would cut most labels short.
    assert {row["industry"] for row in outputs} <= set(examples.INDUSTRIES)
    assert {
        row["company"]
        for row in outputs
        if isinstance(row["company"], str) and not row["company"].startswith(("{", "["))
    }
    assert "company" in industry["json_columns"]["outputs"]  # text, objects and numbers: JSON text
    errors = pq.read_table(industry["errors_uri"]).to_pylist()
    assert {row["id"]: row["error"].split(":")[0] for row in errors} == expected_errors

    haiku = json.loads((tmp_path / "out" / "haiku" / "manifest.json").read_text())
    assert (haiku["rows_in"], haiku["rows_out"]) == (20, 20), haiku
    haiku_rows = pq.read_table(haiku["outputs_uri"]).to_pylist()
    for row in haiku_rows:  # **row kept the input's columns, the preprocess's and the engine's
        assert row["answer"] == row["generated_text"] and row["item"].startswith("Topic number")
        assert row["sampling_params"] == {"temperature": 0.3, "max_tokens": 12}
        assert row["messages"][1] == {"role": "user", "content": row["item"]}
        assert 0 < row["num_generated_tokens"] <= 12
    assert haiku["json_columns"]["outputs"] == ["meta"]

    vision = json.loads((tmp_path / "out" / "vision" / "manifest.json").read_text())
    assert (vision["rows_in"], vision["rows_out"]) == (5, 4), vision
    assert vision["errors_by_reason"] == {"missing image": 1}
    vision_rows = pq.read_table(vision["outputs_uri"]).to_pylist()
    assert all(row["resp"] == row["generated_text"] and row["num_input_tokens"] > 16 for row in vision_rows)
    # The messages written with each row describe its image instead of carrying it (the input's own
    # image column, which **row keeps, is the user's data, as in Ray Data LLM).
    assert all("base64" not in json.dumps(row["messages"], default=str) for row in vision_rows)
