"""An input of one large file is prepared in several tasks, and to the same rows (read/prepare_spread.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_raybatch.pipeline.read import prepare_spread
from tests.unit.pipeline.ray_env import run_in_ray_env

ROWS = 3000


@pytest.mark.parametrize(
    ("sizes", "spread"),
    [
        ([prepare_spread.SPREAD_FROM_BYTES], True),
        ([prepare_spread.SPREAD_FROM_BYTES - 1], False),
        # one task a file already
        ([prepare_spread.SPREAD_FROM_BYTES, prepare_spread.SPREAD_FROM_BYTES], False),
        ([], False),
    ],
)
def test_only_an_input_of_one_large_file_is_spread(sizes: list[int], spread: bool) -> None:
    assert prepare_spread.spreads(sizes) is spread


_SNIPPET = """
import functools, json
import ray
ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
ray.data.DataContext.get_current().enable_progress_bars = False
from airflow_provider_raybatch.pipeline import run
from airflow_provider_raybatch.pipeline.read import prepare_spread
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

spec = BatchInferenceSpec(
    model="/no/model", input_uri=FOLDER, output_uri="/tmp/unused-out/", input_format="csv",
    user_template="Classify {name}: {about}", id_column="customer_id",
)
original = prepare_spread.spread

def outcome():
    kept = run._prepared_rows(spec)
    rows = kept.rows.select_columns(["id", "source", "prompt", "messages", "error"]).take_all()
    blocks = kept.rows.materialize().num_blocks()
    return {"blocks": blocks, "rows_in": kept.rows_in, "repeated": kept.repeated_ids,
            "rows": sorted(rows, key=lambda row: row["source"])}

fused = outcome()
prepare_spread.spread = functools.partial(original, spread_from_bytes=1, rows_per_block=500)
spread = outcome()
print(json.dumps({"fused": fused, "spread": spread}))
"""


@pytest.mark.timeout(300)
def test_one_files_rows_are_prepared_in_blocks_of_their_own_to_the_same_rows(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    lines = ["customer_id,name,about"]
    lines += [f'{n % 2900},"Co {n}","makes ""parts"",\nline two {n}"' for n in range(ROWS)]  # ids repeat
    (folder / "customers.csv").write_text("\n".join(lines) + "\n")
    out = run_in_ray_env(_SNIPPET.replace("FOLDER", json.dumps(str(folder))))
    fused, spread = out["fused"], out["spread"]
    assert fused["blocks"] == 1  # below the bound: parsed and prepared in the read task
    assert spread["blocks"] >= ROWS // 500  # 500 rows a block, each prepared in a task of its own
    assert spread["rows_in"] == fused["rows_in"] == ROWS
    assert spread["repeated"] == fused["repeated"] == 100
    assert spread["rows"] == fused["rows"]
    first = fused["rows"][0]  # a quoted field's newline kept: the file was parsed whole before the cut
    assert first["error"] is None and 'makes \\"parts\\",\\nline two' in first["messages"], first
