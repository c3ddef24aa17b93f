"""Hostile input files and model buckets.

* A bare ``\\r`` inside a JSONL line was one request to the API and two error rows to the pipeline
  (``bytes.splitlines``). Both now split at ``\\n`` only (shared/jsonl.py), so the API's count and
  the pipeline's rows agree for any bytes: the property tests check it for any chunking.
* Ints past int64 and NaN or infinite floats in an OpenAI body or a preprocess's ``sampling_params``
  went on to the engine as numbers; they now fail their row with a reason naming the field. Such
  numbers in an ordinary column stay a kept value (JSON text).
* ``fetch_model`` joined each S3 key's tail to the local folder, so a key such as ``m/a/../../x``
  wrote a file outside it (the S3 client resolves the dots, reading the object they point at) and
  ``m//abs/path`` made folders at ``/abs``: checked here against a real S3 server on loopback.
* A whole input file was parsed into one list of records; a file over ``MAX_INPUT_FILE_BYTES`` now
  fails the job with its name, and the records are yielded one at a time.
"""

from __future__ import annotations

import json
import posixpath
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_raybatch.pipeline import row_steps, storage
from airflow_provider_raybatch.pipeline.generate import model_cache, models
from airflow_provider_raybatch.pipeline.openai import openai_batch
from airflow_provider_raybatch.pipeline.read import rows
from airflow_provider_raybatch.pipeline.read.rows import InputFileTooLargeError, parse_file
from airflow_provider_raybatch.shared.json_numbers import INT64_MAX
from airflow_provider_raybatch.shared.jsonl import count_requests
from airflow_provider_raybatch.shared.openai_endpoints import CHAT
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec
from tests.unit.pipeline.row_path import run_rows


def spec_of(tmp_path: Path, **params: Any) -> BatchInferenceSpec:  # Any: spec values.
    defaults = {
        "model": "m",
        "input_uri": str(tmp_path / "input" / "in.jsonl"),
        "output_uri": str(tmp_path / "out"),
    }
    return BatchInferenceSpec.build(**{**defaults, **params})


def chat_line(custom_id: str, **body: Any) -> bytes:  # Any: JSON values.
    messages = [{"role": "user", "content": "Hello"}]
    line = {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": {"messages": messages, **body}}
    return json.dumps(line).encode()


# -- a bare \r --------------------------------------------------------------------------------------


def test_a_bare_cr_inside_a_json_string_is_one_error_row_naming_its_line() -> None:
    data = b'{"a": 1}\n{"q": "evil\rsecond half"}\n{"b": 2}\n'

    records = list(parse_file("in.jsonl", data, "jsonl"))

    # splitlines made it "{"q": "evil" and "second half"}": two error rows for one request.
    assert [r["source"] for r in records] == ["in.jsonl:1", "in.jsonl:2", "in.jsonl:3"]
    assert [r["error"] is None for r in records] == [True, False, True]
    assert records[1]["error"].startswith("malformed JSON: line 2, ")
    assert "control character" in records[1]["error"]
    assert count_requests([data]) == len(records) == 3


def test_a_bare_cr_between_json_tokens_is_whitespace() -> None:
    records = list(parse_file("in.jsonl", b'{"a":\r1,\r"b": 2}\r\n', "jsonl"))

    assert [(r["source"], r["error"], json.loads(r["row"])) for r in records] == [
        ("in.jsonl:1", None, {"a": 1, "b": 2})
    ]


def test_an_openai_line_with_a_bare_cr_fails_alone_and_the_counts_agree(tmp_path: Path) -> None:
    data = b"\r\n".join([chat_line("ok-1"), chat_line("x").replace(b"Hello", b"Hel\rlo"), chat_line("ok-2")])
    spec = spec_of(tmp_path, openai_endpoint=CHAT)

    result = run_rows({"in.jsonl": data}, spec, tmp_path)

    assert result.manifest["rows_in"] == count_requests([data]) == 3
    assert result.manifest["rows_out"] == 2 and result.manifest["rows_failed"] == 1
    [error] = result.errors
    assert error["error"]["code"] == "invalid_json"
    assert error["error"]["message"].startswith("malformed JSON: line 2, ")
    assert error["error"]["message"].endswith("(line in.jsonl:2)")


# The bytes JSON Lines framing cares about, and some JSON, so that lines parse, fail and go blank.
_PIECES = st.sampled_from(
    [
        b"\n",
        b"\r",
        b"\r\n",
        b" ",
        b"\t",
        b"\x0b",
        b"\x0c",
        b"\xef\xbb\xbf",
        b"\xff",
        b"x",
        b'{"a": 1}',
        b'{"q": "a\rb"}',
        b"[1]",
        b'"s"',
        b"{",
        b"}",
        b":",
        b",",
        chat_line("c").removesuffix(b"}"),
        b"}",
    ]
)
_FILES = st.lists(_PIECES, max_size=30).map(b"".join) | st.binary(max_size=80)


def _chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = sorted({min(cut, len(data)) for cut in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False)]


@given(_FILES, st.lists(st.integers(min_value=0, max_value=80), max_size=6))
@settings(max_examples=300, deadline=None)
def test_property_the_api_count_is_the_jsonl_readers_rows_for_any_bytes(data: bytes, cuts: list[int]) -> None:
    records = list(parse_file("in.jsonl", data, "jsonl"))  # never raises

    assert count_requests(_chunked(data, cuts)) == len(records)
    numbers = [int(r["source"].rpartition(":")[2]) for r in records]
    assert numbers == sorted(set(numbers)) and all(n >= 1 for n in numbers)
    assert all((r["error"] is None) == isinstance(json.loads(r["row"]), dict) for r in records)


@given(_FILES, st.lists(st.integers(min_value=0, max_value=80), max_size=6))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_property_the_api_count_is_the_openai_readers_rows_for_any_bytes(
    tmp_path: Path, data: bytes, cuts: list[int]
) -> None:
    spec = spec_of(tmp_path, openai_endpoint=CHAT)

    prepared = [row_steps.prepare_row(r, spec) for r in parse_file("in.jsonl", data, "jsonl")]  # never raises

    assert count_requests(_chunked(data, cuts)) == len(prepared)
    assert all(row["error"] is None or ": " in row["error"] for row in prepared)


# -- numbers past int64, NaN and infinity -----------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field", "detail"),
    [
        # max_tokens had its own bound before; the reason now says which number and why.
        pytest.param(
            {"max_tokens": 10**20},
            "body.max_tokens",
            "100000000000000000000 is out of range",
            id="max-tokens",
        ),
        # These went to the engine as they were.
        pytest.param(
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "n", "schema": {"type": "string", "maxLength": 10**20}},
                }
            },
            "body.response_format.json_schema.schema.maxLength",
            "out of range",
            id="schema-int",
        ),
        pytest.param(
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "n", "schema": {"type": "number", "maximum": float("inf")}},
                }
            },
            "body.response_format.json_schema.schema.maximum",
            "inf is not a finite number",
            id="schema-inf",
        ),
        pytest.param(
            {"messages": [{"role": "user", "content": "hi", "weight": -(10**30)}]},
            "body.messages[0].weight",
            "out of range",
            id="message-field",
        ),
        pytest.param(
            {"metadata": {"n": float("nan")}},
            "body.metadata.n",
            "nan is not a finite number",
            id="ignored-field-nan",
        ),
    ],
)
def test_an_openai_body_number_past_int64_or_not_finite_fails_its_line_naming_the_field(
    body: dict[str, Any],
    field: str,
    detail: str,  # Any: JSON values.
) -> None:
    line = json.loads(chat_line("big"))
    line["body"].update(body)

    with pytest.raises(openai_batch.RequestError) as caught:
        openai_batch.parse_request(line, CHAT, {})

    assert caught.value.param == field
    assert str(caught.value).startswith(f"invalid request: {field}: ")
    assert detail in str(caught.value)


def test_openai_lines_with_huge_numbers_are_error_rows_and_the_rest_are_served(tmp_path: Path) -> None:
    data = b"\n".join(
        [
            chat_line("fine", max_tokens=8),
            b'{"custom_id": "inf", "url": "/v1/chat/completions", "body": {"messages": '
            b'[{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", '
            b'"json_schema": {"name": "n", "schema": {"maximum": Infinity}}}}}',
            chat_line("big-seed", seed=2**64),
        ]
    )

    result = run_rows({"in.jsonl": data}, spec_of(tmp_path, openai_endpoint=CHAT), tmp_path)

    assert result.manifest["rows_out"] == 1
    reasons = {row["custom_id"]: row["error"]["message"] for row in result.errors}
    assert set(reasons) == {"inf", "big-seed"}
    assert "body.response_format.json_schema.schema.maximum: inf is not a finite number" in reasons["inf"]
    assert "body.seed" in reasons["big-seed"]
    for request in result.engine_requests:  # what reached the engine: numbers it can hold
        assert all(abs(v) <= INT64_MAX for v in request["sampling_params"].values() if isinstance(v, int))


@pytest.mark.parametrize(
    ("params", "detail"),
    [
        pytest.param(
            b'{"max_tokens": 100000000000000000000}',
            "sampling_params.max_tokens: 100000000000000000000 is out of range",
            id="max-tokens",
        ),
        pytest.param(b'{"seed": -100000000000000000000}', "sampling_params.seed: ", id="seed"),
        pytest.param(b'{"temperature": Infinity}', "sampling_params.temperature: inf is not a", id="inf"),
        pytest.param(b'{"top_p": NaN}', "sampling_params.top_p: nan is not a finite number", id="nan"),
        pytest.param(b'{"logit_bias": {"7": 1e999}}', "sampling_params.logit_bias['7']: inf", id="nested"),
    ],
)
def test_a_preprocess_sampling_param_past_int64_or_not_finite_fails_its_row(
    tmp_path: Path, params: bytes, detail: str
) -> None:
    data = b'{"q": "fine", "params": {"max_tokens": 4}}\n{"q": "hostile", "params": ' + params + b"}\n"
    spec = spec_of(tmp_path, preprocess="tests.unit.pipeline.row_functions.with_own_params")

    result = run_rows({"in.jsonl": data}, spec, tmp_path)

    assert result.manifest["rows_out"] == 1 and result.manifest["rows_failed"] == 1
    [error] = result.errors
    assert error["source"] == "in.jsonl:2"
    assert error["error"].startswith("bad sampling_params: the row's ") and detail in error["error"]
    assert [r["sampling_params"] for r in result.engine_requests] == [{"max_tokens": 4}]


def test_an_int_past_int64_in_an_ordinary_column_is_kept_as_json_text(tmp_path: Path) -> None:
    data = b'{"id": 1, "q": "a", "n": 100000000000000000000}\n{"id": 2, "q": "b", "n": -5}\n'
    spec = spec_of(tmp_path, user_template="{q}", id_column="id")

    result = run_rows({"in.jsonl": data}, spec, tmp_path)

    assert result.manifest["rows_out"] == 2 and result.errors == []
    assert result.manifest["json_columns"]["outputs"] == ["n"]
    assert sorted(json.loads(row["n"]) for row in result.outputs) == [-5, 10**20]


# -- model keys that leave the model's folder ---------------------------------------------------------


@pytest.fixture
def s3_model(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:  # Any: the S3Server fixture.
    """A fresh prefix in a bucket of the loopback S3 server, which fetch_model reaches with its keys."""
    monkeypatch.setattr(
        storage,
        "_s3_options",
        storage.S3Options(
            endpoint_url=s3_server.endpoint_url,
            region="us-east-1",
            access_key=s3_server.access_key,
            secret_key=s3_server.secret_key,
        ),
    )
    client = s3_server.client()
    bucket = "hostile-models"
    if bucket not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
        client.create_bucket(Bucket=bucket)
    return client, bucket, f"m-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("tail", ["a/../../escaped", "../escaped", "./../escaped", "a/../b/../../../escaped"])
def test_fetch_model_refuses_a_key_with_dot_dot_and_writes_nothing(
    s3_model: Any,  # Any: (boto3 client, bucket, prefix).
    tmp_path: Path,
    tail: str,
) -> None:
    client, bucket, prefix = s3_model
    tail = tail.replace("escaped", f"escaped-{prefix}")
    client.put_object(Bucket=bucket, Key=f"{prefix}/config.json", Body=b"{}")
    client.put_object(Bucket=bucket, Key=f"{prefix}/{tail}", Body=b"pwned")
    # The S3 client resolves the dots in the request's URL, so the old fetch read the object the key
    # points at and wrote it outside the model's folder: put one there.
    client.put_object(Bucket=bucket, Key=posixpath.normpath(f"{prefix}/{tail}").lstrip("./"), Body=b"pwned")
    cache = tmp_path / "deep" / "cache"
    target = cache / "m"

    with pytest.raises(ValueError, match="refusing to fetch the model") as caught:
        models.fetch_model(f"s3://{bucket}/{prefix}", str(target))

    assert f"{prefix}/{tail}" in str(caught.value)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # not the escape, not config.json
    assert not cache.exists() or list(cache.iterdir()) == []  # no partial folder left behind


def test_fetch_model_refuses_a_key_that_is_an_absolute_path(s3_model: Any, tmp_path: Path) -> None:
    client, bucket, prefix = s3_model
    outside = tmp_path / "outside" / "authorized_keys"
    client.put_object(Bucket=bucket, Key=f"{prefix}/config.json", Body=b"{}")
    client.put_object(
        Bucket=bucket, Key=f"{prefix}/{outside}", Body=b"ssh-ed25519 attacker"
    )  # prefix//tmp/...

    with pytest.raises(ValueError, match="not a plain relative path"):
        models.fetch_model(f"s3://{bucket}/{prefix}", str(tmp_path / "cache" / "m"))

    assert not outside.parent.exists()  # the old fetch made this folder before its read failed


def test_fetch_model_still_fetches_a_plain_model(s3_model: Any, tmp_path: Path) -> None:
    client, bucket, prefix = s3_model
    files = {"config.json": b"{}", "tokenizer/tokenizer.json": b"{}", "a..b/weights.bin": b"\0" * 10}
    for name, body in files.items():
        client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=body)

    assert models.fetch_model(f"s3://{bucket}/{prefix}", str(tmp_path / "m")) == 3

    assert {p.relative_to(tmp_path / "m").as_posix() for p in (tmp_path / "m").rglob("*") if p.is_file()} == {
        *files,
        model_cache.COMPLETE_MARKER,
    }


# -- one huge input file ------------------------------------------------------------------------------


def test_an_input_file_over_the_cap_fails_with_its_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(rows, "MAX_INPUT_FILE_BYTES", 1024)
    data = b'{"a": 1}\n' * 200  # 1,800 bytes
    (tmp_path / "uploads").mkdir()
    for name in ("uploads/big.jsonl", "big.jsonl"):  # a local file is checked on disk
        (tmp_path / name).write_bytes(data)
    folder = str(tmp_path)

    with pytest.raises(InputFileTooLargeError) as caught:
        list(
            row_steps.parse_file_row({"path": f"{folder}/uploads/big.jsonl", "bytes": data}, folder, "jsonl")
        )

    message = str(caught.value)
    assert "'uploads/big.jsonl'" in message and "1800 bytes" in message and "1024 bytes" in message
    assert "Split it" in message
    # At the cap exactly, the file is read.
    monkeypatch.setattr(rows, "MAX_INPUT_FILE_BYTES", len(data))
    assert (
        len(list(row_steps.parse_file_row({"path": f"{folder}/big.jsonl", "bytes": data}, folder, "jsonl")))
        == 200
    )


def test_a_large_jsonl_file_is_parsed_one_record_at_a_time(tmp_path: Path) -> None:
    """parse_file_row yields records as Ray's flat_map takes them: no list of lines or records.

    The old path held ``splitlines()`` of the whole file and every record at once, several times the
    file's size (a 200 MiB file peaked at 1.5 GiB in a Ray worker); here the parse adds next to
    nothing to the file's own bytes.
    """
    data = b"".join(
        b'{"id": %d, "text": "%s"}\n' % (i, b"lorem ipsum " * 8) for i in range(40_000)
    )  # ~4.5 MiB
    (tmp_path / "big.jsonl").write_bytes(data)  # a local file is checked on disk
    file_row = {"path": str(tmp_path / "big.jsonl"), "bytes": data}

    tracemalloc.start()
    try:
        count = sum(1 for _ in row_steps.parse_file_row(file_row, str(tmp_path), "jsonl"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert count == 40_000
    assert peak < len(data) // 8, peak  # the old path: over 2x len(data)


@pytest.mark.parametrize(
    "sampling_params",
    [
        {"seed": 10**20},
        {"temperature": float("nan")},
        {"top_p": float("inf")},
        {"structured_outputs": {"json": {"type": "integer", "maximum": float("inf")}}},
    ],
)
def test_the_operators_own_sampling_params_refuse_numbers_the_engine_cannot_take(sampling_params) -> None:
    """Not a row's value but the DAG's: refused when the spec is built, naming the field, before any
    job starts (it would otherwise reach vLLM on every row)."""
    from airflow_provider_raybatch.shared.exceptions import BatchSpecError
    from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

    with pytest.raises(BatchSpecError, match=r"sampling_params\.\S+: .*(out of range|not a finite number)"):
        BatchInferenceSpec.build(
            model="m", input_uri="/in.jsonl", output_uri="/out", sampling_params=sampling_params
        )


def test_an_input_file_over_the_cap_is_named_before_any_worker_reads_it(tmp_path: Path, monkeypatch) -> None:
    """The driver lists the input's files with their sizes (run._read_records does this before
    read_binary_files), so one file too large to parse fails the job naming it, not a worker OOM."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "small.jsonl").write_bytes(b'{"a": 1}\n')
    (folder / "huge.jsonl").write_bytes(b'{"a": "' + b"x" * 4096 + b'"}\n')
    (folder / "notes.txt").write_bytes(b"x" * 10_000)  # not an input file: never read, never checked
    monkeypatch.setattr(rows, "MAX_INPUT_FILE_BYTES", 2048)
    sizes = dict(storage.input_file_sizes(str(folder), [".jsonl"]))
    assert set(sizes) == {str(folder / "small.jsonl"), str(folder / "huge.jsonl")}
    rows.check_input_file_size(str(folder / "small.jsonl"), sizes[str(folder / "small.jsonl")])
    with pytest.raises(rows.InputFileTooLargeError, match="huge.jsonl"):
        for path, size in sorted(sizes.items()):
            rows.check_input_file_size(path, size)
    assert storage.input_file_sizes(str(folder / "small.jsonl"), None) == [(str(folder / "small.jsonl"), 9)]
