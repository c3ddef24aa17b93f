"""A row's id may be at most ``MAX_ID_CHARS`` characters; a longer one is that row's error row.

Row data is untrusted (docs/security.md). The driver holds every row's id at once to find repeats
(pipeline/read/dedupe.py): 200,000 rows of 4 KiB ids grew it by 1.6 GiB, and up to the driver scan's
million rows of longer ones would run it out of memory. A row whose id is refused keeps its source
as its id, so no long id reaches the scan.
"""

from __future__ import annotations

import json

from airflow_provider_raybatch.pipeline import row_marks, row_steps
from airflow_provider_raybatch.pipeline.read import rows
from airflow_provider_raybatch.shared.openai_endpoints import CHAT
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

_LONGEST = row_marks.MAX_ID_CHARS


def _prepared(line: dict[str, object], **spec: object) -> row_steps.PreparedRow:
    fields: dict[str, object] = {"model": "/m", "input_uri": "/in/rows.jsonl", "output_uri": "/out", **spec}
    (record,) = rows.parse_file("rows.jsonl", json.dumps(line).encode() + b"\n", "jsonl")
    return row_steps.prepare_row(record, BatchInferenceSpec(**fields))  # type: ignore[arg-type]


def test_an_id_column_value_past_the_longest_id_is_its_row_s_error_and_never_its_id() -> None:
    spec = {"id_column": "key", "user_template": "Classify {text}"}

    kept = _prepared({"key": "k" * _LONGEST, "text": "a"}, **spec)
    refused = _prepared({"key": "k" * (_LONGEST + 1), "text": "a"}, **spec)

    assert (kept["id"], kept["error"]) == ("k" * _LONGEST, None)
    assert refused["id"] == "rows.jsonl:1"
    assert refused["error"] == (
        f"bad id: id column 'key' holds {_LONGEST + 1:,} characters, more than an id may ({_LONGEST:,})"
    )


def test_an_openai_line_whose_custom_id_is_past_the_longest_id_is_its_error_row() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    line = {"custom_id": "c" * (_LONGEST + 1), "method": "POST", "url": CHAT, "body": body}

    refused = _prepared(line, openai_endpoint=CHAT)

    assert refused["id"] == "rows.jsonl:1"
    assert str(refused["error"]).startswith(f"bad id: custom_id has {_LONGEST + 1:,} characters, over")
    assert _prepared({**line, "custom_id": "c" * _LONGEST}, openai_endpoint=CHAT)["error"] is None
