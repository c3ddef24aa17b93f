"""The whole row path in process (tests/unit/pipeline/row_path.py): Ray Data LLM's row contract, drift,
ids, the failed-rows verdict, and generated inputs (hypothesis) against the invariants:
nothing escapes, rows in = rows out + rows failed, every id exactly once, every failure has a reason.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_raybatch.pipeline import row_steps
from airflow_provider_raybatch.pipeline.read import rows as rows_module
from airflow_provider_raybatch.shared.manifest import failed_rows
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec
from tests.unit.pipeline.row_path import FAIL_ROW, run_rows

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "integration" / "dags"
sys.path.insert(0, str(EXAMPLES_DIR))  # the examples module, as the DAGs folder puts it on sys.path
import ray_data_llm_examples as examples  # noqa: E402


def spec_of(tmp_path: Path, input_name: str, **params: Any) -> BatchInferenceSpec:  # Any: spec values.
    defaults = {
        "model": "m",
        "input_uri": str(tmp_path / "input" / input_name),
        "output_uri": str(tmp_path / "out"),
    }
    return BatchInferenceSpec.build(**{**defaults, **params})


def jsonl(*rows: Any) -> bytes:  # Any: JSON values.
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def engine_row(number: int = 1, **fields: Any) -> dict[str, Any]:  # Any: a row's values.
    """An engine's answer to ticket ``T-<number>`` of in.jsonl, with ``fields`` set."""
    return {
        "id": f"T-{number}",
        "source": f"in.jsonl:{number}",
        "row": json.dumps({"id": f"T-{number}"}),
        "request": None,
        "sampling": None,
        "generated_text": "",
        "num_input_tokens": 9,
        "num_generated_tokens": 6,
        **fields,
    }


def assert_invariants(result, ids: list[str] | None = None) -> None:
    manifest = result.manifest
    assert manifest["rows_in"] == manifest["rows_out"] + manifest["rows_failed"]
    assert len(result.outputs) == manifest["rows_out"] and len(result.errors) == manifest["rows_failed"]
    assert all(row["error"] and ":" in row["error"] for row in result.errors), result.errors
    if ids is not None:
        seen = [row["id"] for row in result.errors] + [
            row.get("row_id", row.get("id")) for row in result.outputs
        ]
        assert Counter(seen) == Counter(ids)


# -- Ray Data LLM's row contract -----------------------------------------------------------------


def test_the_docs_quickstart_preprocess_and_postprocess_work_unchanged(tmp_path: Path) -> None:
    spec = spec_of(
        tmp_path,
        "items.jsonl",
        preprocess="ray_data_llm_examples.haiku_preprocess",
        postprocess="ray_data_llm_examples.haiku_postprocess",
    )
    result = run_rows(
        {"items.jsonl": jsonl({"item": "Autumn leaves"}, {"item": "A cold river"})}, spec, tmp_path
    )

    assert result.manifest["rows_out"] == 2, result.errors
    first = next(row for row in result.outputs if row["item"] == "Autumn leaves")
    # **row kept every column: the input's, the preprocess's, and what the engine added.
    assert first["answer"] == first["generated_text"] and first["answer"]
    assert first["sampling_params"] == {"temperature": 0.3, "max_tokens": 12}
    assert first["messages"][1] == {"role": "user", "content": "Autumn leaves"}
    assert first["num_input_tokens"] > 0
    # The engine got the row's own sampling parameters, not the operator's (none here).
    assert {json.dumps(r["sampling_params"], sort_keys=True) for r in result.engine_requests} == {
        '{"max_tokens": 12, "temperature": 0.3}'
    }


def test_per_row_structured_outputs_reach_the_engine_and_are_checked(tmp_path: Path) -> None:
    spec = spec_of(
        tmp_path,
        "c.jsonl",
        preprocess="ray_data_llm_examples.industry_preprocess",
        postprocess="ray_data_llm_examples.industry_postprocess",
        sampling_params={"max_tokens": 4, "temperature": 0.7},
    )
    rows = [{"Company": "Acme Legal"}, {"Company": "Saint Mary"}, {"Company": "Shopco"}]
    result = run_rows({"c.jsonl": jsonl(*rows)}, spec, tmp_path)

    assert sorted(row["company"] for row in result.outputs) == ["Acme Legal", "Saint Mary", "Shopco"]
    assert {row["industry"] for row in result.outputs} <= set(examples.INDUSTRIES)
    for request in result.engine_requests:  # the row's over the operator's, key by key
        assert request["sampling_params"] == {
            "max_tokens": 8,
            "temperature": 0,
            "structured_outputs": {"choice": examples.INDUSTRIES},
        }
    # The rows' own labels are counted (the operator's params set no choice).
    assert sum(result.manifest["generated_text_counts"].values()) == 3
    assert set(result.manifest["generated_text_counts"]) <= set(examples.INDUSTRIES)


def test_labels_are_counted_for_constrained_rows_only_and_tokens_before_postprocess(tmp_path: Path) -> None:
    spec = spec_of(
        tmp_path,
        "x.jsonl",
        preprocess="tests.unit.pipeline.row_functions.choice_on_some_rows",
        postprocess="tests.unit.pipeline.row_functions.answer_only",
    )
    rows = [{"q": "a", "labels": ["yes", "no"]}, {"q": "b free text"}, {"q": "c", "labels": ["yes", "no"]}]
    result = run_rows({"x.jsonl": jsonl(*rows)}, spec, tmp_path)

    assert result.manifest["generated_text_counts"] == {"yes": 2}  # not the free-text answer
    assert all(set(row) == {"answer"} for row in result.outputs)  # postprocess dropped the token columns
    assert result.manifest["rows_out"] == 3
    # Tokens are the engine's, whatever postprocess kept: the stand-in engine answers "yes" (1 token)
    # twice and the free-text row with the last words of its prompt ("b free text": 3 tokens).
    assert result.manifest["tokens_out"] == 5 and result.manifest["tokens_in"] > 0


def test_a_json_schema_with_differing_branches_reaches_the_engine_intact(tmp_path: Path) -> None:
    spec = spec_of(
        tmp_path,
        "q.jsonl",
        preprocess="ray_data_llm_examples.json_answer_preprocess",
        postprocess="ray_data_llm_examples.json_answer_postprocess",
    )
    result = run_rows(
        {"q.jsonl": jsonl({"question": "2+2?"}, {"question": "Capital of France?"})}, spec, tmp_path
    )

    assert result.manifest["rows_out"] == 2, result.errors
    for request in result.engine_requests:  # not unified by Arrow: no "enum": None on the null branch
        assert request["sampling_params"]["structured_outputs"]["json"] == examples.ANSWER_SCHEMA
    assert {row["question_prompt"] for row in result.outputs} == {
        "Question: 2+2?\nAnswer in JSON:",
        "Question: Capital of France?\nAnswer in JSON:",
    }


def test_vision_preprocess_images_in_every_accepted_form(tmp_path: Path) -> None:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (32, 24), "red").save(buffer, format="PNG")
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / "cat.png").write_bytes(buffer.getvalue())
    import base64

    data_url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    rows = [
        {"image": "cat.png"},
        {"image": data_url},
        {"image": str(tmp_path / "input" / "cat.png")},
        {"image": "missing.png"},
    ]
    spec = spec_of(
        tmp_path,
        "imgs.jsonl",
        preprocess="ray_data_llm_examples.vision_preprocess",
        postprocess="ray_data_llm_examples.vision_postprocess",
    )
    result = run_rows({"imgs.jsonl": jsonl(*rows)}, spec, tmp_path)

    assert_invariants(result)
    assert result.manifest["rows_out"] == 3, result.errors
    assert [row["error"].split(":")[0] for row in result.errors] == ["missing image"]
    for row in result.outputs:  # the messages' image is described, never copied, in what is written
        assert "base64" not in json.dumps(row["messages"])
        assert row["resp"] == row["generated_text"]


def test_a_preprocess_that_returns_no_prompt_fails_that_row_with_its_reason(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, "x.jsonl", preprocess="json.loads")  # returns no dict: a row error
    result = run_rows({"x.jsonl": jsonl({"a": 1})}, spec, tmp_path)

    assert [row["error"].split(":")[0] for row in result.errors] == ["preprocess failed"]


def test_a_conversation_the_template_rejects_fails_alone_in_its_block(tmp_path: Path) -> None:
    rows = [{"q": "fine"}, {"q": "twice", "twice": True}, {"q": "also fine"}]
    spec = spec_of(tmp_path, "x.jsonl", preprocess="tests.unit.pipeline.row_functions.to_messages")
    result = run_rows({"x.jsonl": jsonl(*rows)}, spec, tmp_path)

    assert result.manifest["rows_out"] == 2, result.errors
    assert [row["error"].split(":")[0] for row in result.errors] == ["chat template failed"]


def test_per_row_sampling_params_that_the_pipeline_cannot_honour_fail_the_row(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, "x.jsonl", preprocess="tests.unit.pipeline.row_functions.with_own_params")
    rows = [
        {"q": "ok", "params": {"max_tokens": 3}},
        {"q": "n", "params": {"n": 3}},
        {"q": "detok", "params": {"detokenize": False}},
        {"q": "bad", "params": {"max_tokens": "ten"}},
        {"q": "typo", "params": {"max_token": 3}},
    ]
    result = run_rows({"x.jsonl": jsonl(*rows)}, spec, tmp_path)

    assert result.manifest["rows_out"] == 1
    reasons = sorted(row["error"] for row in result.errors)
    assert all(reason.startswith("bad sampling_params: the row's sampling_params") for reason in reasons)
    assert any("'n'" in r for r in reasons) and any("detokenize" in r for r in reasons)


def test_per_row_sampling_numbers_past_int64_or_not_finite_fail_the_row(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, "x.jsonl", preprocess="tests.unit.pipeline.row_functions.with_own_params")
    data = (
        b'{"q": "ok", "params": {"seed": 9223372036854775807}}\n'
        b'{"q": "big", "params": {"max_tokens": 100000000000000000000}}\n'
        b'{"q": "nan", "params": {"top_p": NaN}}\n'
    )
    result = run_rows({"x.jsonl": data}, spec, tmp_path)

    assert result.manifest["rows_out"] == 1
    assert sorted(row["error"] for row in result.errors) == [
        "bad sampling_params: the row's sampling_params.max_tokens: 100000000000000000000 is out of range "
        "(at most 64-bit integers)",
        "bad sampling_params: the row's sampling_params.top_p: nan is not a finite number",
    ]
    assert [r["sampling_params"] for r in result.engine_requests] == [{"seed": 2**63 - 1}]


def test_parse_file_row_yields_records_and_refuses_a_file_over_the_cap(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "a.jsonl").write_bytes(b'{"a": 1}\n{"a": 2}\n')  # a local file is checked on disk
    file_row = {"path": str(tmp_path / "a.jsonl"), "bytes": b'{"a": 1}\n{"a": 2}\n'}

    records = row_steps.parse_file_row(file_row, str(tmp_path), "jsonl")

    assert not isinstance(records, list)  # a generator: Ray's flat_map blocks it as it goes
    assert [r["source"] for r in records] == ["a.jsonl:1", "a.jsonl:2"]
    monkeypatch.setattr(rows_module, "MAX_INPUT_FILE_BYTES", 17)
    with pytest.raises(rows_module.InputFileTooLargeError, match="'a.jsonl' is 18 bytes, over the 17 bytes"):
        next(row_steps.parse_file_row(file_row, str(tmp_path), "jsonl"))


# -- drift and ids ---------------------------------------------------------------------------------


def test_drifting_types_and_nested_values_never_fail_the_job(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "Company": "Acme", "n": 1, "tags": ["x"]},
        {"id": "b", "Company": {"nested": 1}, "n": "two", "tags": []},
        {"id": "c", "Company": None, "n": 2**64 - 1, "extra": {"k": [1, {"z": None}]}},
        {"id": "d", "Company": True, "n": 1.5, "tags": [1, "mixed"], "text": "line\u2028sep\x00ctl é"},
        {"id": "e", "Company": 12345678901234567890123, "n": None, "empty": {}},
    ]
    for output_format in ("parquet", "jsonl"):
        out = tmp_path / output_format
        spec = spec_of(
            tmp_path,
            "drift.jsonl",
            output_uri=str(out),
            user_template="About {id}",
            id_column="id",
            output_format=output_format,
        )
        result = run_rows({"drift.jsonl": jsonl(*rows)}, spec, tmp_path)

        assert_invariants(result, ids=["a", "b", "c", "d", "e"])
        assert result.manifest["rows_out"] == 5, result.errors
        by_id = {row["id"]: row for row in result.outputs}
        if output_format == "parquet":
            assert set(result.manifest["json_columns"]["outputs"]) >= {"Company", "n"}
            assert json.loads(by_id["b"]["Company"]) == {"nested": 1}
            assert json.loads(by_id["e"]["Company"]) == 12345678901234567890123
            assert set(by_id["a"]) == set(by_id["e"])  # every part has every column
        else:
            assert by_id["b"]["Company"] == {"nested": 1} and by_id["c"]["n"] == 2**64 - 1
            assert by_id["d"]["text"] == "line\u2028sep\x00ctl é"


def test_lone_surrogates_from_json_escapes_never_fail_the_block(tmp_path: Path) -> None:
    lines = b'{"Id": "a", "q": "bad \\ud800 text"}\n{"Id": "b\\udfff", "q": "fine"}\n'
    for output_format in ("parquet", "jsonl"):
        spec = spec_of(
            tmp_path,
            "x.jsonl",
            user_template="{q}",
            id_column="Id",
            output_format=output_format,
            output_uri=str(tmp_path / output_format),
        )
        result = run_rows({"x.jsonl": lines}, spec, tmp_path)

        assert_invariants(result)
        assert result.manifest["rows_out"] == 2, result.errors
        assert sorted(row["Id"] for row in result.outputs) == ["a", "b\\udfff"]


def test_ids_are_text_as_written(tmp_path: Path) -> None:
    data = b"Id,Company\n007,A\n7,B\n1e3,C\nNaN,D\n,E\n"
    spec = spec_of(tmp_path, "c.csv", user_template="{Company}", id_column="Id")
    result = run_rows({"c.csv": data}, spec, tmp_path)

    assert sorted(row["Id"] for row in result.outputs) == ["007", "1e3", "7", "NaN"]
    assert [row["error"].split(":")[0] for row in result.errors] == ["missing id"]


@pytest.mark.parametrize(
    ("value", "text"), [(7, "7"), (7.0, "7.0"), (True, "true"), (-0.5, "-0.5"), (10**30, str(10**30))]
)
def test_a_non_text_jsonl_id_has_one_canonical_text(tmp_path: Path, value: Any, text: str) -> None:
    spec = spec_of(tmp_path, "x.jsonl", user_template="{q}", id_column="Id")
    result = run_rows({"x.jsonl": jsonl({"Id": value, "q": "hi"})}, spec, tmp_path)

    assert [row["Id"] for row in result.outputs] == [text]


def test_an_id_that_is_an_object_or_missing_is_an_error_row(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, "x.jsonl", user_template="{q}", id_column="Id")
    rows = [{"Id": {"a": 1}, "q": "x"}, {"Id": [1], "q": "x"}, {"q": "x"}, {"Id": "", "q": "x"}]
    result = run_rows({"x.jsonl": jsonl(*rows)}, spec, tmp_path)

    assert sorted(row["error"].split(":")[0] for row in result.errors) == [
        "bad id",
        "bad id",
        "missing id",
        "missing id",
    ]


def test_a_failing_preprocess_keeps_the_rows_id(tmp_path: Path) -> None:
    spec = spec_of(
        tmp_path,
        "x.jsonl",
        user_template="{q}",
        id_column="Id",
        preprocess="tests.unit.pipeline.row_functions.explode",
    )
    result = run_rows({"x.jsonl": jsonl({"Id": "c-1", "q": "x"})}, spec, tmp_path)

    assert [(row["id"], row["error"].split(":")[0]) for row in result.errors] == [
        ("c-1", "preprocess failed")
    ]


def test_input_columns_named_like_ours_are_kept_beside_them(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, "x.jsonl", user_template="{q}")
    row = {"q": "hi", "row_id": "mine", "generated_text": "old", "num_input_tokens": "many"}
    result = run_rows({"x.jsonl": jsonl(row)}, spec, tmp_path)

    (output,) = result.outputs
    assert output["row_id"] == "x.jsonl:1" and output["input_row_id"] == "mine"
    assert output["input_generated_text"] == "old" and output["generated_text"] != "old"
    assert output["input_num_input_tokens"] == "many" and isinstance(output["num_input_tokens"], int)


def test_an_input_column_named_like_a_renamed_one_keeps_both_values(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, "x.jsonl", user_template="{q}")
    row = {
        "q": "hi",
        "generated_text": "old",
        "input_generated_text": "mine",
        "input_input_generated_text": 3,
    }
    result = run_rows({"x.jsonl": jsonl(row)}, spec, tmp_path)

    (output,) = result.outputs
    assert output["input_generated_text"] == "mine" and output["input_input_generated_text"] == 3
    assert output["input_input_input_generated_text"] == "old" and output["generated_text"] != "old"


def test_a_template_format_spec_that_does_not_fit_the_value_fails_that_row(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, "x.jsonl", user_template="Score {score:.1f}")
    result = run_rows(
        {"x.jsonl": jsonl({"score": 2.25}, {"score": [1, 2]}, {"score": "high"})}, spec, tmp_path
    )

    assert result.manifest["rows_out"] == 1
    assert {row["error"].split(":")[0] for row in result.errors} == {"bad template value"}
    assert all("'score'" in row["error"] for row in result.errors)


def test_an_engine_failure_and_a_postprocess_failure_are_rows_errors(tmp_path: Path) -> None:
    spec = spec_of(
        tmp_path, "x.jsonl", user_template="{q}", postprocess="tests.unit.pipeline.row_functions.picky"
    )
    result = run_rows(
        {"x.jsonl": jsonl({"q": "fine"}, {"q": FAIL_ROW}, {"q": "postprocess hates this"})}, spec, tmp_path
    )

    assert sorted(row["error"].split(":")[0] for row in result.errors) == [
        "inference failed",
        "postprocess failed",
    ]


# -- the failed-rows verdict -------------------------------------------------------------------------


def test_a_run_over_its_failed_share_is_committed_with_the_reason(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, "x.jsonl", user_template="{q}", max_failed_fraction=0.25)
    rows = [{"q": "a"}, {"q": ""}, {"q": ""}, {"q": "b"}]
    result = run_rows({"x.jsonl": jsonl(*rows)}, spec, tmp_path)

    assert result.manifest["rows_out"] == 2  # committed all the same
    assert "2 of 4 rows failed" in result.manifest["failed_rows_message"]
    assert "'empty prompt' 2" in result.manifest["failed_rows_message"]


@pytest.mark.parametrize("fraction", [0.2, 0.19])
def test_failed_rows_and_the_share_count_each_id_once_whichever_of_its_rows_failed(
    tmp_path: Path, fraction: float
) -> None:
    """Ten ids. Two fail before the engine (an empty prompt) in each of their three rows; a third has a
    bad row and then a good one, which runs. Two of ten ids failed: 20%, not 6 of 14 rows (43%), nor
    the bad row of the id that has its answer."""
    spec = spec_of(tmp_path, "x.jsonl", user_template="{q}", id_column="id", max_failed_fraction=fraction)
    rows = [{"id": "a", "q": ""}, {"id": "b", "q": ""}] * 3 + [{"id": "k", "q": ""}, {"id": "k", "q": "k"}]
    rows += [{"id": row_id, "q": row_id} for row_id in "cdefghi"]
    result = run_rows({"x.jsonl": jsonl(*rows)}, spec, tmp_path)

    assert_invariants(result)
    manifest = result.manifest
    assert (manifest["rows_in"], manifest["rows_out"], manifest["rows_failed"]) == (15, 8, 7)
    assert manifest["rows_duplicate"] == 5  # a and b twice each, k once: rows_in less the 10 ids
    assert failed_rows(manifest) == 2
    if fraction == 0.2:
        assert manifest["failed_rows_message"] is None
    else:
        assert "2 of 10 rows failed (20.0%, duplicate ids not counted)" in manifest["failed_rows_message"]


def test_a_run_within_its_failed_share_passes(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, "x.jsonl", user_template="{q}", max_failed_fraction=0.5)
    result = run_rows({"x.jsonl": jsonl({"q": "a"}, {"q": ""})}, spec, tmp_path)

    assert result.manifest["failed_rows_message"] is None


# -- generated inputs --------------------------------------------------------------------------------

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
    | st.text(alphabet=st.characters(codec=None, categories=["Cs", "Cc", "Zl", "Zp"]), max_size=3)
    | st.just("x" * 100_000)  # a huge value
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
IDS = st.one_of(st.text(min_size=0, max_size=6), st.integers(-3, 3), st.none(), st.floats(), st.booleans())
ROWS = st.lists(
    st.fixed_dictionaries(
        {"Id": IDS, "q": JSON_VALUES}, optional={"extra": JSON_VALUES, "more": JSON_VALUES}
    ),
    max_size=12,
)


def _line(row: dict[str, Any]) -> bytes:  # Any: JSON values.
    return json.dumps(
        row
    ).encode()  # NaN/Infinity tokens: Python's json reads them, as users' files have them


def _expected_ids(rows: list[dict[str, Any]], raw: list[bytes]) -> list[str]:  # Any: JSON values.
    """What each line's id is: its Id's text where it has one, else its <file>:<line>."""
    ids = []
    for number, (row, line) in enumerate(zip(rows, raw, strict=True), start=1):
        try:
            ids.append(
                row_steps.row_id(SPEC_WITH_ID, json.loads(line), f"x.jsonl:{number}")
                if row is not None
                else f"x.jsonl:{number}"
            )
        except ValueError:
            ids.append(f"x.jsonl:{number}")
    return ids


SPEC_WITH_ID = BatchInferenceSpec.build(
    model="m", input_uri="x.jsonl", output_uri="o", user_template="{q}", id_column="Id"
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    rows=ROWS,
    junk=st.lists(st.sampled_from([b"{", b"[1]", b"\xff\xfe", b'"text"', b"null"]), max_size=3),
    output_format=st.sampled_from(["parquet", "jsonl"]),
)
def test_generated_rows_keep_the_invariants(tmp_path_factory, rows, junk, output_format) -> None:
    tmp_path = tmp_path_factory.mktemp("rows")
    raw = [_line(row) for row in rows] + junk
    spec = spec_of(
        tmp_path,
        "x.jsonl",
        user_template="{q}",
        id_column="Id",
        output_format=output_format,
        max_failed_fraction=1.0,
    )
    result = run_rows({"x.jsonl": b"\n".join(raw) + b"\n"}, spec, tmp_path)

    assert result.manifest["rows_in"] == len(raw)
    assert_invariants(result)
    # Every line's id exactly once: outputs under their id, errors under their id or position.
    listed = [row["Id"] for row in result.outputs] + [row["id"] for row in result.errors]
    assert len(listed) == len(raw)
    good_ids = [row["Id"] for row in result.outputs]
    assert len(good_ids) == len(set(good_ids))  # a repeated id is one output, then duplicate errors
    # The thresholds count ids: an id fails when none of its rows has an output; a row with no id of its
    # own (an error named by its position) is one id on its own.
    failed = {
        ("row", row["source"]) if row["id"] == row["source"] else ("id", row["id"]) for row in result.errors
    }
    answered = {("id", row_id) for row_id in good_ids}
    assert failed_rows(result.manifest) == len(failed - answered)
    assert result.manifest["rows_in"] - result.manifest["rows_duplicate"] == len(failed | answered)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    table=st.lists(
        st.lists(
            st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=8), min_size=3, max_size=3
        ),
        max_size=10,
    )
)
def test_generated_csv_rows_keep_the_invariants(tmp_path_factory, table) -> None:
    tmp_path = tmp_path_factory.mktemp("csv")
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["Id", "q", "other"])
    writer.writerows(table)
    spec = spec_of(tmp_path, "x.csv", user_template="{q}", id_column="Id", max_failed_fraction=1.0)
    result = run_rows({"x.csv": buffer.getvalue().encode()}, spec, tmp_path)

    assert result.manifest["rows_in"] == len(table)
    assert_invariants(result)
    for row in result.outputs:  # ids come back exactly as written
        assert row["Id"] in {line[0] for line in table}


def test_nan_and_infinity_cells_are_written_as_valid_json(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, "x.csv", user_template="{q}", output_format="jsonl")
    result = run_rows({"x.csv": b"q,score\nhello,NaN\nworld,inf\n"}, spec, tmp_path)

    assert result.manifest["rows_out"] == 2
    assert all(row["score"] is None or math.isfinite(row["score"]) for row in result.outputs)


@pytest.mark.parametrize(
    ("text", "sampling", "error"),
    [
        ('{"summary": "The cust', None, "output not JSON: "),  # the spec's schema, cut by max_tokens
        ('{"summary": "Late order"}', None, None),
        (
            "{",
            json.dumps({"structured_outputs": {"json_object": True}}),
            "output not JSON: ",
        ),  # the row's own
        ("{", json.dumps({"max_tokens": 5}), None),  # the row asked for free text
    ],
)
def test_output_constrained_to_json_and_cut_short_is_an_error_row(
    tmp_path: Path, text: str, sampling: str | None, error: str | None
) -> None:
    schema = {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]}
    spec = spec_of(
        tmp_path,
        "in.jsonl",
        user_template="Summarise ticket {id}",
        sampling_params={"max_tokens": 6, "structured_outputs": {"json": schema}},
    )
    staged = row_steps._staged_result(engine_row(sampling=sampling, generated_text=text), spec)  # type: ignore[arg-type]

    if error is None:
        assert staged["ok"] is True, staged
    else:
        reason = json.loads(staged["record"])["error"]
        assert not staged["ok"] and reason.startswith(error) and "after 6 tokens" in reason, reason


def test_an_output_too_large_to_read_back_is_its_rows_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An OpenAI line of n=128 choices of 400 tokens with 20 logprobs each was 84 MB of JSON, over 1 GiB
    # read back: the commit refused its part on every try. The bound is made small here.
    monkeypatch.setattr(row_steps, "PART_LINES_COST_MOST", 20_000)
    spec = spec_of(tmp_path, "in.jsonl", user_template="Summarise ticket {id}")
    small = row_steps._staged_safely(engine_row(generated_text="x" * 100), spec)  # type: ignore[arg-type]
    large = row_steps._staged_safely(engine_row(generated_text="x" * 30_000), spec)  # type: ignore[arg-type]

    assert small["ok"] is True
    assert large["ok"] is False
    reason = json.loads(large["record"])["error"]
    assert reason.startswith("output too large: 30,") and "fewer tokens, choices (n) or logprobs" in reason


def test_rows_whose_outputs_cost_more_together_than_a_part_may_are_staged_as_several(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The replica cuts its rows by what the engine's rows cost; a staged OpenAI line with logprobs
    # costs far more (32 of 2,000 tokens x 20 logprobs: 1.95 GiB read back in one part, refused on
    # every try). The bound is made small here.
    from airflow_provider_raybatch.pipeline.stage import part_runs
    from airflow_provider_raybatch.pipeline.stage.parts import PartWriter

    monkeypatch.setattr(part_runs, "PART_LINES_COST_MOST", 25_000)
    spec = spec_of(tmp_path, "in.jsonl", user_template="Summarise ticket {id}")
    rows = [engine_row(n, generated_text="x" * 10_000) for n in range(1, 4)]
    writer = PartWriter(str(tmp_path / "staging"), "jsonl", count_labels=False)

    staged = row_steps.stage_engine_rows(rows, spec, writer)  # type: ignore[arg-type]

    assert [part.sidecar["sources"] for part in staged] == [["in.jsonl:1", "in.jsonl:2"], ["in.jsonl:3"]]
    assert all(row["ok"] for part in staged for row in writer.read_part(part))


def test_an_error_row_does_not_quote_an_input_whose_json_is_too_long(tmp_path: Path) -> None:
    # JSON escapes a control character as six characters: a CSV cell of 12 MiB of \x01 made a 75 MB
    # input cell, past the one Parquet page a value may have; the commit refused it on every try.
    spec = spec_of(tmp_path, "in.csv", user_template="{prompt}", output_format="parquet")
    quoted = json.dumps({"prompt": "", "junk": "\x01" * 3_000_000})  # 18 MB of JSON
    row = {"id": "in.csv:1", "source": "in.csv:1", "row": quoted, "error": "empty prompt: no text"}

    record = json.loads(row_steps.rejected_result(row, spec)["record"])  # type: ignore[arg-type]
    small = json.loads(row_steps.rejected_result({**row, "row": '{"prompt": ""}'}, spec)["record"])  # type: ignore[arg-type]

    assert record["input"] is None
    assert record["error"].startswith("empty prompt: no text (its input, 18,000,")
    assert small["input"] == '{"prompt": ""}' and small["error"] == "empty prompt: no text"


def _staged_in_each_format(tmp_path: Path, row: dict[str, Any]) -> tuple[bool, str]:
    """Whether ``row`` is staged ok in a JSONL output, and its error's reason in a Parquet one."""
    specs = {
        output_format: spec_of(tmp_path, "in.jsonl", user_template="{id}", output_format=output_format)
        for output_format in ("jsonl", "parquet")
    }
    jsonl = row_steps._staged_safely(row, specs["jsonl"])  # type: ignore[arg-type]
    parquet = row_steps._staged_safely(row, specs["parquet"])  # type: ignore[arg-type]
    assert parquet["ok"] is False, parquet
    return jsonl["ok"], json.loads(parquet["record"])["error"]


def test_a_parquet_output_value_longer_than_a_page_is_its_rows_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_raybatch.pipeline.read import parquet_plan

    monkeypatch.setattr(parquet_plan, "PARQUET_PAGE_BYTES", 10_000)  # 64 MiB, made small here
    jsonl_ok, reason = _staged_in_each_format(tmp_path, engine_row(generated_text="x" * 20_000))

    assert jsonl_ok
    assert reason.startswith("output too large: column 'generated_text' holds 20,000 bytes"), reason


def test_a_line_that_is_not_ascii_is_charged_as_its_escapes_are_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lone surrogate is written as a six-byte escape, which the commit charges 4 bytes wide: rows
    # charged as their text made a part the commit refused (2,500,000 of them: 15 MB -> 60 MB read back).
    from airflow_provider_raybatch.pipeline.stage import part_runs
    from airflow_provider_raybatch.pipeline.stage.parts import PartWriter

    monkeypatch.setattr(part_runs, "PART_LINES_COST_MOST", 1_000_000)
    text = "\ud800" * 30_000
    staged = [
        {"source": f"in.jsonl:{n}", "ok": True, "record": json.dumps({"note": text}, ensure_ascii=False)}
        for n in (1, 2)
    ]
    writer = PartWriter(str(tmp_path / "staging"), "jsonl", count_labels=False)

    written = writer.write_parts(staged)  # type: ignore[arg-type]

    assert [part.sidecar["sources"] for part in written] == [["in.jsonl:1"], ["in.jsonl:2"]]
    assert all(
        json.loads(row["record"])["note"] == text for part in written for row in writer.read_part(part)
    )


def test_a_parquet_row_whose_nulls_in_a_list_cost_too_much_read_back_is_its_rows_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each null in a list is read back as a null in every field of the list's widest item: one row of
    # 513 KB (1,000 nulls beside an object of 1,000 500-character keys) was a part the commit refused
    # on every try. The bound is made small here (1 GiB in the product).
    from airflow_provider_raybatch.pipeline.read import staged_parquet

    monkeypatch.setattr(staged_parquet, "FILE_COST_BYTES", 1_000_000)
    wide = {f"field_{key:03d}_".ljust(50, "k"): key for key in range(100)}
    row = engine_row(generated_text="yes", row=json.dumps({"id": "T-1", "items": [None] * 100 + [wide]}))

    jsonl_ok, reason = _staged_in_each_format(tmp_path, row)

    assert jsonl_ok
    assert reason.startswith("output too large: as a Parquet row it is past what the commit reads back"), (
        reason
    )
