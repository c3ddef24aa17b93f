"""Tests of airflow_provider_raybatch/specs.py: the batch job spec and its rules."""

from __future__ import annotations

import re
from typing import Any

import pytest

from airflow_provider_raybatch.shared.exceptions import BatchSpecError, RayBatchError
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec, infer_input_format, template_fields

BASE: dict[str, Any] = {  # Any: spec parameter values.
    "model": "Qwen/Qwen2.5-0.5B-Instruct",
    "input_uri": "s3://bucket/in/companies.jsonl",
    "output_uri": "s3://bucket/out/run-1/",
    "user_template": "Industry of {Company}?",
}


def build(**overrides: Any) -> BatchInferenceSpec:  # Any: spec parameter values.
    params = {**BASE, **overrides}
    for key in [k for k, v in overrides.items() if v is _DROP]:
        del params[key]
    return BatchInferenceSpec.build(**params)


_DROP = object()


# -- valid specs --------------------------------------------------------------------------------


def test_minimal_spec_builds_with_defaults() -> None:
    spec = build()

    assert spec.model == BASE["model"]
    assert spec.user_template == "Industry of {Company}?"
    assert spec.output_format == "parquet"
    assert spec.batch_size == 64
    assert spec.concurrency is None  # chosen as the job starts (pipeline/generate/default_layout.py)
    assert spec.sampling_params == {}
    assert spec.engine_kwargs == {}
    assert spec.resolved_input_format == "jsonl"


def test_full_spec_builds() -> None:
    spec = build(
        input_uri="/data/in/",
        input_format="csv",
        output_uri="/data/out",
        output_format="jsonl",
        system_prompt="Answer with one word.",
        preprocess="my_pkg.fns:clean",
        postprocess="my_pkg.fns.tidy",
        sampling_params={"max_tokens": 16, "temperature": 0, "structured_outputs": {"choice": ["a", "b"]}},
        engine_kwargs={"max_model_len": 2048, "tensor_parallel_size": 2, "enforce_eager": True},
        batch_size=8,
        concurrency=(1, 4),
        accelerator_type="H100",
        replica_resources={"CPU": 1},
        id_column="Id",
        keep_columns=["Company", "Country"],
    )

    assert spec.concurrency == (1, 4)
    assert spec.resolved_input_format == "csv"
    assert spec.keep_columns == ["Company", "Country"]


def test_messages_column_spec_builds_without_template() -> None:
    spec = build(user_template=_DROP, messages_column="messages")

    assert spec.messages_column == "messages"
    assert spec.user_template is None


def test_spec_error_is_a_value_error_of_the_provider() -> None:
    with pytest.raises(BatchSpecError) as info:
        build(batch_size=0)

    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, RayBatchError)
    assert str(info.value).startswith("Invalid batch job spec: ")


def test_spec_is_frozen() -> None:
    spec = build()

    with pytest.raises(Exception, match="frozen"):
        spec.model = "other"  # type: ignore[misc]


# -- invalid specs: each message names the field ------------------------------------------------

INVALID_CASES = [
    pytest.param({"concurrency": (3, 1)}, ["concurrency", "min must be <= max"], id="concurrency-min-gt-max"),
    pytest.param({"concurrency": 0}, ["concurrency"], id="concurrency-zero"),
    pytest.param({"batch_size": 0}, ["batch_size"], id="batch-size-zero"),
    pytest.param(
        {"sampling_params": {"temprature": 0.2}}, ["sampling_params", "temprature"], id="unknown-sampling-key"
    ),
    pytest.param({"sampling_params": {"max_tokens": 0}}, ["max_tokens", ">= 1"], id="max-tokens-zero"),
    pytest.param({"sampling_params": {"max_tokens": "8"}}, ["max_tokens"], id="max-tokens-text"),
    pytest.param({"sampling_params": {"temperature": -1}}, ["temperature"], id="negative-temperature"),
    pytest.param(
        {"sampling_params": {"structured_outputs": {"choice": ["a"], "regex": "a|b"}}},
        ["structured_outputs", "exactly one", "choice", "regex"],
        id="structured-two-kinds",
    ),
    pytest.param(
        {"sampling_params": {"structured_outputs": {"disable_any_whitespace": True}}},
        ["structured_outputs", "exactly one"],
        id="structured-no-kind",
    ),
    pytest.param(
        {"sampling_params": {"structured_outputs": {"choice": []}}},
        ["structured_outputs", "choice", "non-empty"],
        id="structured-empty-choice",
    ),
    pytest.param(
        {"sampling_params": {"structured_outputs": {"choice": ["a", ""]}}},
        ["choice", "non-empty strings"],
        id="structured-empty-label",
    ),
    pytest.param(
        {"sampling_params": {"structured_outputs": {"choise": ["a"]}}},
        ["structured_outputs", "choise"],
        id="structured-unknown-key",
    ),
    pytest.param(
        {"sampling_params": {"structured_outputs": ["a", "b"]}},
        ["structured_outputs", "must be a dict"],
        id="structured-not-dict",
    ),
    pytest.param(
        {"messages_column": "messages"}, ["messages_column", "user_template"], id="both-prompt-sources"
    ),
    pytest.param({"user_template": _DROP}, ["messages_column", "user_template"], id="no-prompt-source"),
    pytest.param(
        {"user_template": _DROP, "messages_column": "messages", "system_prompt": "Be brief."},
        ["system_prompt", "user_template"],
        id="system-prompt-without-template",
    ),
    pytest.param(
        {"user_template": "Industry of {0}?"}, ["user_template", "positional"], id="template-index-field"
    ),
    pytest.param(
        {"user_template": "Industry of {a.b}?"}, ["user_template", "{a.b}"], id="template-attribute"
    ),
    pytest.param(
        {"user_template": "Industry of {a[0]}?"}, ["user_template", "{a[0]}"], id="template-index-access"
    ),
    pytest.param(
        {"user_template": "Industry of {Company!x}?"},
        ["user_template", "{Company!x}", "conversion"],
        id="template-unknown-conversion",
    ),
    pytest.param(
        {"keep_columns": ["Company", "generated_text"]},
        ["keep_columns", "generated_text"],
        id="keep-generated-column",
    ),
    pytest.param({"keep_columns": ["error"]}, ["keep_columns", "error"], id="keep-error-column"),
    pytest.param({"keep_columns": [""]}, ["keep_columns"], id="keep-empty-name"),
    pytest.param({"id_column": "error"}, ["id_column", "'error'"], id="id-column-error"),
    pytest.param({"id_column": "num_generated_tokens"}, ["id_column"], id="id-column-generated"),
    pytest.param({"modle": "typo"}, ["modle", "unknown parameter"], id="unknown-parameter"),
    pytest.param({"input_uri": "gs://bucket/in.jsonl"}, ["input_uri", "'gs'"], id="gs-input"),
    pytest.param({"output_uri": "https://host/out"}, ["output_uri", "'https'"], id="https-output"),
    pytest.param({"input_uri": "data/input"}, ["input_format", "data/input"], id="uninferrable-format"),
    pytest.param({"input_format": "xml"}, ["input_format"], id="unknown-input-format"),
    pytest.param({"output_format": "csv"}, ["output_format"], id="unknown-output-format"),
    pytest.param({"output_uri": BASE["input_uri"]}, ["output_uri", "differ"], id="output-is-input"),
    pytest.param(
        {"input_uri": "s3://bucket/in/", "input_format": "jsonl", "output_uri": "s3://bucket/in"},
        ["output_uri", "differ"],
        id="output-is-input-trailing-slash",
    ),
    pytest.param(
        {"engine_kwargs": {"tensor_parallel_size": 0}}, ["tensor_parallel_size", ">= 1"], id="tp-zero"
    ),
    pytest.param({"engine_kwargs": {"max_model_len": "2k"}}, ["max_model_len"], id="max-model-len-text"),
    pytest.param({"engine_kwargs": {"model": "other"}}, ["engine_kwargs['model']"], id="engine-model"),
    pytest.param(
        {"engine_kwargs": {"hf_overrides": {1, 2}}},
        ["engine_kwargs", "JSON-serializable"],
        id="engine-not-json",
    ),
    pytest.param(
        {"sampling_params": {"logit_bias": object()}},
        ["sampling_params", "JSON-serializable"],
        id="sampling-not-json",
    ),
    pytest.param({"preprocess": "not a path"}, ["preprocess", "dotted path"], id="preprocess-not-dotted"),
    pytest.param(
        {"postprocess": "module_only"}, ["postprocess", "dotted path"], id="postprocess-no-function"
    ),
    pytest.param({"replica_resources": {}}, ["replica_resources"], id="replica-resources-empty"),
    pytest.param({"replica_resources": {"CPU": 0}}, ["replica_resources"], id="replica-resources-zero"),
    pytest.param({"model": ""}, ["model"], id="empty-model"),
    pytest.param({"image_size": (448, 448)}, ["image_size", "needs image_column"], id="image-size-no-column"),
    pytest.param(
        {"image_max_side": 448}, ["image_max_side", "needs image_column"], id="image-max-side-no-column"
    ),
    pytest.param({"image_column": "image", "image_size": (448, 0)}, ["image_size"], id="image-size-zero"),
    pytest.param({"image_column": "image", "image_size": (448,)}, ["image_size"], id="image-size-one-number"),
    pytest.param(
        {"image_column": "image", "image_max_side": 0}, ["image_max_side"], id="image-max-side-zero"
    ),
    pytest.param(
        {"image_column": "image", "image_size": (448, 448), "image_max_side": 448},
        ["image_size", "image_max_side", "exclusive"],
        id="image-size-and-max-side",
    ),
    pytest.param(
        {"image_column": "image", "user_template": _DROP, "messages_column": "messages"},
        ["image_column", "needs user_template"],
        id="image-with-messages-column",
    ),
    pytest.param(
        {"image_column": "image", "user_template": "Caption {image}"},
        ["image_column", "user_template", "remove {image}"],
        id="image-in-template",
    ),
    pytest.param(
        {"image_column": "image", "keep_columns": ["name", "image"]},
        ["image_column", "keep_columns", "never copied"],
        id="image-kept",
    ),
    pytest.param(
        {"image_column": "image", "id_column": "image"}, ["image_column", "id_column"], id="image-is-id"
    ),
    pytest.param(
        {"image_column": "image", "engine_kwargs": {"limit_mm_per_prompt": {"image": 0}}},
        ["limit_mm_per_prompt", "image_column"],
        id="image-limit-zero",
    ),
    pytest.param({"image_column": ""}, ["image_column"], id="image-column-empty"),
]


@pytest.mark.parametrize(("overrides", "expected"), INVALID_CASES)
def test_invalid_spec_raises_naming_the_field(overrides: dict[str, Any], expected: list[str]) -> None:
    with pytest.raises(BatchSpecError) as info:
        build(**overrides)

    message = str(info.value)
    for fragment in expected:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_several_problems_are_reported_together() -> None:
    with pytest.raises(BatchSpecError) as info:
        build(batch_size=0, sampling_params={"max_tokens": 0}, input_uri="gs://b/x.jsonl")

    message = str(info.value)
    assert "batch_size" in message
    assert "max_tokens" in message
    assert "input_uri" in message


def test_long_inputs_are_shortened_in_the_message() -> None:
    with pytest.raises(BatchSpecError) as info:
        build(sampling_params={"bogus": "x" * 10_000})

    assert len(str(info.value)) < 2_000


def test_uninferrable_format_is_fine_with_explicit_input_format() -> None:
    spec = build(input_uri="data/input", input_format="parquet")

    assert spec.resolved_input_format == "parquet"


@pytest.mark.parametrize(
    ("uri", "kept"),
    [
        ("/abs/in.csv", "/abs/in.csv"),
        ("rel/in.csv", "rel/in.csv"),
        ("file:///abs/in.csv", "file:///abs/in.csv"),
        ("s3://b/in.csv", "s3://b/in.csv"),
        # The scheme as every reader compares it: "FILE://" went to readers that follow links, and
        # "S3://" to pyarrow's own S3 settings rather than the job's.
        ("S3://b/in.csv", "s3://b/in.csv"),
        ("FILE:///abs/in.csv", "file:///abs/in.csv"),
    ],
)
def test_supported_uri_schemes(uri: str, kept: str) -> None:
    assert build(input_uri=uri).input_uri == kept
    assert (
        build(output_uri=uri.removesuffix("/in.csv") + "/out").output_uri
        == kept.removesuffix("/in.csv") + "/out"
    )


# -- input format -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("in.jsonl", "jsonl"),
        ("in.ndjson", "jsonl"),
        ("s3://b/in.json", "jsonl"),
        ("IN.JSONL", "jsonl"),
        ("in.csv", "csv"),
        ("s3://b/in.parquet", "parquet"),
        ("in.pq", "parquet"),
        ("s3://b/in.parquet?versionId=3", "parquet"),
        ("s3://b/in.csv?x=a.jsonl", "csv"),
        ("data/in.csv/", "csv"),
    ],
)
def test_infer_input_format(uri: str, expected: str) -> None:
    assert infer_input_format(uri) == expected


@pytest.mark.parametrize("uri", ["data/input", "in.txt", "s3://b/in.csv.gz", "s3://b/folder/?x=in.csv"])
def test_infer_input_format_raises_naming_input_format(uri: str) -> None:
    with pytest.raises(BatchSpecError, match="input_format"):
        infer_input_format(uri)


@pytest.mark.parametrize("template", ["review_kit/prompt.txt", "prompts/summary.j2", "/opt/t/ticket.jinja"])
def test_a_user_template_that_is_a_files_path_is_refused(template: str) -> None:
    """Every prompt would be the path itself: Airflow reads no template file for this operator."""
    with pytest.raises(BatchSpecError, match=r"reads as a file's path.*read_text\(\)"):
        build(user_template=template)


@pytest.mark.parametrize("template", ["Summarise.", "See notes.txt for {title}", "Classify {text}"])
def test_a_user_template_that_mentions_a_file_is_a_template(template: str) -> None:
    assert build(user_template=template).user_template == template


@pytest.mark.parametrize("input_format", [None, "csv", "jsonl"])
@pytest.mark.parametrize("uri", ["s3://b/in.csv.gz", "/data/tickets.JSONL.ZST", "s3://b/day/rows.zip"])
def test_a_compressed_input_file_is_refused_whatever_its_format(uri: str, input_format: str | None) -> None:
    """Read as csv or jsonl a compressed file is its raw bytes: refused with what to do, not read."""
    with pytest.raises(BatchSpecError, match=r"names a compressed file .*Decompress it first"):
        build(input_uri=uri, input_format=input_format)


# -- template fields ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("Industry of {Company} in {Country}?", ["Company", "Country"]),
        ("{b} then {a} then {b}", ["b", "a", "b"]),
        ("Who is {Customer Id}?", ["Customer Id"]),
        ("{name!r:>10}", ["name"]),
        # No doubled-brace escape (Jinja owns "{{"): "{{x}}" after Jinja is a brace, {x}, a brace.
        ("{{literal}} and {x}", ["literal", "x"]),
        ('Answer as {"label": "...", "tags": {}} for {Company}', ["Company"]),
        ("{ } {} {Company {a:{w}} }}", ["w"]),
        ("no fields at all", []),
        ("", []),
    ],
)
def test_template_fields(template: str, expected: list[str]) -> None:
    assert template_fields(template) == expected


@pytest.mark.parametrize(
    "template", ["{0}", "{ 12 }", "{a.b}", "{a[x]}", "{a!x}", 'JSON {"a": 1} then {x.y}']
)
def test_template_fields_rejects(template: str) -> None:
    with pytest.raises(BatchSpecError, match="user_template"):
        template_fields(template)


def test_template_fields_does_not_miss_fields_nested_in_a_format_spec() -> None:
    """``{a:{w}}`` needs a column ``w`` too; the spec must either list it or refuse the template.

    Otherwise the spec validates and every row later fails rendering with a bare KeyError('w').
    """
    template = "{a:>{w}}"
    try:
        names = template_fields(template)
    except BatchSpecError:
        return
    assert "w" in names, (
        f"template_fields({template!r}) returned {names}, silently dropping the nested field 'w'"
    )


# -- fingerprint, round trip, derived properties ------------------------------------------------


def test_fingerprint_equal_for_equal_specs() -> None:
    first = build(sampling_params={"max_tokens": 8, "temperature": 0.0})
    second = build(sampling_params={"temperature": 0.0, "max_tokens": 8})

    assert first.fingerprint() == second.fingerprint()
    assert re.fullmatch(r"[0-9a-f]{16}", first.fingerprint())


@pytest.mark.parametrize(
    "change",
    [
        {"model": "other/model"},
        {"user_template": "Sector of {Company}?"},
        {"batch_size": 32},
        {"sampling_params": {"max_tokens": 9}},
        {"engine_kwargs": {"max_model_len": 1024}},
        {"output_uri": "s3://bucket/out/run-2/"},
        {"concurrency": (1, 2)},
        {"image_column": "image"},
        {"image_column": "image", "image_size": (448, 448)},
        {"image_column": "image", "image_max_side": 448},
        {"image_allowed_hosts": ["images.internal"]},
        {"image_allowed_local_path": "/data/images"},
        {"image_allowed_s3_prefixes": ["s3://media/photos"]},
    ],
)
def test_fingerprint_changes_with_any_field(change: dict[str, Any]) -> None:
    assert build(**change).fingerprint() != build().fingerprint()


def test_json_round_trip_is_equal() -> None:
    spec = build(
        input_format="jsonl",
        system_prompt="Réponds en un mot: 'oui' ou \"non\".",
        sampling_params={"max_tokens": 4, "structured_outputs": {"choice": ["oui", "non"]}, "stop": ["\n"]},
        engine_kwargs={"max_model_len": 512},
        concurrency=(2, 3),
        replica_resources={"CPU": 1.5},
        keep_columns=["Company"],
        id_column="Id",
        preprocess="fns:pre",
    )

    rebuilt = BatchInferenceSpec.from_json(spec.model_dump_json())

    assert rebuilt == spec
    assert rebuilt.concurrency == (2, 3)
    assert rebuilt.fingerprint() == spec.fingerprint()


@pytest.mark.parametrize(
    "payload",
    [
        "{not json",
        '{"model": "m", "input_uri": "in.jsonl", "output_uri": "out"}',
        '{"model": "m", "input_uri": "in.jsonl", "output_uri": "out", "user_template": "{x}", "extra": 1}',
    ],
)
def test_from_json_raises_spec_error(payload: str) -> None:
    with pytest.raises(BatchSpecError, match="Invalid batch job spec"):
        BatchInferenceSpec.from_json(payload)


def test_structured_choices() -> None:
    assert build(sampling_params={"structured_outputs": {"choice": ["a", "b"]}}).structured_choices == [
        "a",
        "b",
    ]
    assert build(sampling_params={"structured_outputs": {"regex": "a|b"}}).structured_choices is None
    assert build(sampling_params={"max_tokens": 3}).structured_choices is None
    assert build().structured_choices is None


# -- run_key and keep_versions --------------------------------------------------------------------


def test_run_key_and_keep_versions_defaults() -> None:
    spec = build()

    assert spec.run_key == "manual"
    assert spec.keep_versions is False


@pytest.mark.parametrize("run_key", ["a", "classify-m-1-0123456789abcdef", "A.b_c-9", "x" * 128])
def test_valid_run_keys(run_key: str) -> None:
    assert build(run_key=run_key).run_key == run_key


@pytest.mark.parametrize(
    "run_key",
    ["", "has space", "a/b", "../up", "a\\b", "ünï", "x" * 129, "new\nline", "s3://b"],
)
def test_invalid_run_key_names_the_field(run_key: str) -> None:
    with pytest.raises(BatchSpecError) as info:
        build(run_key=run_key)

    message = str(info.value)
    assert "run_key" in message
    assert "pattern" in message, message


def test_run_key_must_be_text() -> None:
    with pytest.raises(BatchSpecError, match="run_key"):
        build(run_key=7)


@pytest.mark.parametrize("run_key", [".", ".."])
def test_run_key_rejects_dot_folder_names(run_key: str) -> None:
    """run_key is a path segment: staging lives in ``<output_uri>/_staging/<run_key>``.

    "." and ".." match the pattern ``^[A-Za-z0-9_.-]{1,128}$``, but on local disk "_staging/.."
    resolves to the output folder itself and "_staging/." to every run's staging. ``commit.publish``
    ends with ``storage.delete_tree(layout.staging_uri)``, so run_key=".." deletes the whole output
    folder, the manifest it has just written included (and "." every other run's staging). The spec
    must refuse them (see also tests/unit/pipeline/test_commit.py).
    """
    with pytest.raises(BatchSpecError, match="run_key"):
        build(run_key=run_key)


def test_fingerprint_ignores_run_key_and_keep_versions() -> None:
    plain = build()

    assert build(run_key="classify-m-1-0123456789abcdef").fingerprint() == plain.fingerprint()
    assert build(keep_versions=True).fingerprint() == plain.fingerprint()
    assert build(run_key="other", keep_versions=True).fingerprint() == plain.fingerprint()


def test_fingerprint_still_changes_with_what_shapes_the_output() -> None:
    """Excluding run_key must not exclude anything else (a guard against a too-broad exclude)."""
    assert build(run_key="k", system_prompt="Be terse.").fingerprint() != build(run_key="k").fingerprint()


def test_json_round_trip_keeps_run_key_and_keep_versions() -> None:
    spec = build(run_key="classify-m2-0123456789abcdef", keep_versions=True)

    rebuilt = BatchInferenceSpec.from_json(spec.model_dump_json())

    assert rebuilt == spec
    assert (rebuilt.run_key, rebuilt.keep_versions) == ("classify-m2-0123456789abcdef", True)


# -- images ---------------------------------------------------------------------------------------


def test_image_spec_builds() -> None:
    spec = build(
        image_column="image", image_size=[448, 336], system_prompt="Caption images.", keep_columns=["name"]
    )

    assert (spec.image_column, spec.image_size, spec.image_max_side) == ("image", (448, 336), None)
    assert build(image_column="image", image_max_side=512).image_max_side == 512
    assert (
        build(image_column="image", engine_kwargs={"limit_mm_per_prompt": {"image": 1}}).image_column
        == "image"
    )
    assert build().image_column is None


def test_image_spec_json_round_trip_is_equal() -> None:
    spec = build(image_column="image", image_size=(448, 336))

    assert BatchInferenceSpec.from_json(spec.model_dump_json()) == spec


# -- the row contract, settings refused rather than dropped, failed-row thresholds ----------------


def test_a_preprocess_alone_may_give_the_prompt() -> None:
    spec = build(user_template=_DROP, preprocess="my_rows.to_messages")

    assert spec.user_template is None and spec.messages_column is None


def test_no_prompt_at_all_names_the_three_ways() -> None:
    with pytest.raises(BatchSpecError, match="no prompt: pass user_template=.*messages_column=.*preprocess"):
        build(user_template=_DROP)


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"n": 3}, r"sampling_params\['n'\]=3 is not supported for rows"),
        ({"logprobs": 2}, r"sampling_params\['logprobs'\]=2 is not supported for rows"),
        ({"prompt_logprobs": 0}, r"sampling_params\['prompt_logprobs'\]=0 is not supported for rows"),
        ({"detokenize": False}, r"sampling_params\['detokenize'\]=False is not supported"),
        ({"max_tokens": True}, r"sampling_params\['max_tokens'\]=True must be an int >= 1"),
    ],
)
def test_sampling_settings_a_row_batch_cannot_honour_are_refused(params: dict, match: str) -> None:
    with pytest.raises(BatchSpecError, match=match):
        build(sampling_params=params)


def test_an_openai_batch_may_ask_for_choices_and_logprobs() -> None:
    spec = build(
        user_template=_DROP, openai_endpoint="/v1/chat/completions", sampling_params={"n": 2, "logprobs": 1}
    )

    assert spec.sampling_params == {"n": 2, "logprobs": 1}


@pytest.mark.parametrize(
    ("input_uri", "output_uri"),
    [
        ("/data/in", "/data/in/out"),
        ("/data/in/", "/data/in/x/../out"),
        ("s3://bucket/in", "s3://bucket/in/run-1"),
        ("file:///data/in", "file:///data/in/out"),
    ],
)
def test_an_output_inside_the_input_is_refused(input_uri: str, output_uri: str) -> None:
    with pytest.raises(BatchSpecError, match="is inside input_uri"):
        build(input_uri=input_uri, output_uri=output_uri, input_format="jsonl")


@pytest.mark.parametrize(
    ("input_uri", "output_uri"), [("/data/in", "/data/inner"), ("s3://b/in", "s3://c/in/x")]
)
def test_an_output_beside_the_input_is_fine(input_uri: str, output_uri: str) -> None:
    assert build(input_uri=input_uri, output_uri=output_uri, input_format="jsonl").output_uri == output_uri


def test_a_template_conversion_python_does_not_know_is_refused() -> None:
    with pytest.raises(BatchSpecError, match=r"\{text!x\} has an unknown conversion"):
        build(user_template="Say {text!x}")


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_max_failed_fraction_is_a_share(value: float) -> None:
    with pytest.raises(BatchSpecError, match="max_failed_fraction"):
        build(max_failed_fraction=value)


def test_failed_row_thresholds_do_not_change_the_fingerprint() -> None:
    assert build(max_failed_fraction=0.5, max_failed_rows=3).fingerprint() == build().fingerprint()


def test_an_image_size_past_what_an_image_part_holds_is_refused() -> None:
    with pytest.raises(BatchSpecError, match=r"image_size=\(10000, 10000\) is 100,000,000 pixels"):
        build(image_column="image", user_template="Describe it.", image_size=(10000, 10000))


def test_the_spec_and_the_images_agree_on_the_largest_image() -> None:
    from airflow_provider_raybatch.pipeline.read import images
    from airflow_provider_raybatch.shared.specs import MAX_IMAGE_PIXELS

    assert MAX_IMAGE_PIXELS == images.PART_MAX_PIXELS


# -- where images may come from (pipeline/read/image_sources.py) --------------------------------------


def test_image_sources_default_to_nothing_extra_and_round_trip() -> None:
    plain = build()
    assert (plain.image_allowed_hosts, plain.image_allowed_local_path, plain.image_allowed_s3_prefixes) == (
        [],
        None,
        [],
    )

    spec = build(
        image_column="image",
        image_allowed_hosts=["images.internal", "10.0.0.0/8", "fd00::/8", "192.168.1.2", "[::1]", "Cdn.Corp"],
        image_allowed_local_path="/data/images",
        image_allowed_s3_prefixes=["s3://media/photos/", "s3://other-bucket"],
    )

    assert BatchInferenceSpec.from_json(spec.model_dump_json()) == spec


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"image_allowed_hosts": ["http://images.internal"]},
            "image_allowed_hosts[0]='http://images.internal'",
        ),
        ({"image_allowed_hosts": ["ok.internal:8080", "images.internal:99999"]}, "image_allowed_hosts[1]"),
        ({"image_allowed_hosts": ["10.0.0.0/8:80"]}, "image_allowed_hosts[0]"),
        ({"image_allowed_hosts": ["images.internal/photos"]}, "image_allowed_hosts[0]"),
        ({"image_allowed_hosts": ["10.0.0.1/8"]}, "is not a CIDR block"),
        ({"image_allowed_hosts": ["*.internal"]}, "not a host name, IP address or CIDR block"),
        ({"image_allowed_hosts": [""]}, "image_allowed_hosts[0]"),
        ({"image_allowed_hosts": ["2130706433"]}, "image_allowed_hosts[0]"),
        ({"image_allowed_hosts": "images.internal"}, "image_allowed_hosts"),
        ({"image_allowed_local_path": "data/images"}, "image_allowed_local_path='data/images' must be"),
        ({"image_allowed_local_path": "s3://b/images"}, "image_allowed_s3_prefixes"),
        ({"image_allowed_local_path": "file:///data"}, "image_allowed_local_path"),
        ({"image_allowed_s3_prefixes": ["media/photos"]}, "image_allowed_s3_prefixes[0]='media/photos'"),
        ({"image_allowed_s3_prefixes": ["s3://"]}, "image_allowed_s3_prefixes[0]"),
        ({"image_allowed_s3_prefixes": ["s3://media/../secret"]}, "without '.' or '..' steps"),
        ({"image_allowed_s3_prefixes": ["gs://media/photos"]}, "image_allowed_s3_prefixes[0]"),
    ],
)
def test_image_sources_named_badly_are_refused(overrides: dict[str, Any], expected: str) -> None:
    with pytest.raises(BatchSpecError) as info:
        build(image_column="image", **overrides)

    assert expected in str(info.value)


def test_the_spec_and_the_image_policy_read_an_allowed_host_the_same_way() -> None:
    """The pipeline's ImageSources checks what the spec checks, with the same functions."""
    from airflow_provider_raybatch.pipeline.read.image_sources import ImageSources

    with pytest.raises(TypeError, match=r"allowed_hosts\[0\]='images.internal:0'"):
        ImageSources(allowed_hosts=("images.internal:0",))
    with pytest.raises(TypeError, match="allowed_local_path"):
        ImageSources(allowed_local_path="relative/path")
    with pytest.raises(TypeError, match="allowed_s3_prefixes"):
        ImageSources(allowed_s3_prefixes=("media/photos",))


def test_keep_warm_seconds_says_how_long_not_what_so_a_retry_with_it_resumes() -> None:
    assert build(keep_warm_seconds=600).fingerprint() == build().fingerprint()
    assert build(keep_warm_seconds=0).keep_warm_seconds == 0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"keep_warm_seconds": -1}, "keep_warm_seconds"),
        ({"keep_warm_seconds": 86_401}, "keep_warm_seconds"),
        ({"keep_warm_seconds": float("nan")}, "keep_warm_seconds"),
        ({"keep_warm_seconds": 60, "engine_kwargs": {"tensor_parallel_size": 2}}, "one-GPU engines only"),
        ({"keep_warm_seconds": 60, "engine_kwargs": {"pipeline_parallel_size": 2}}, "one-GPU engines only"),
    ],
)
def test_a_keep_warm_window_out_of_range_or_on_a_parallel_engine_is_refused(
    overrides: dict, message: str
) -> None:
    with pytest.raises(BatchSpecError, match=message):
        build(**overrides)


@pytest.mark.parametrize(
    ("field", "overrides"),
    [
        ("id_column", {}),
        ("messages_column", {"user_template": _DROP}),
        ("image_column", {}),
    ],
)
def test_an_empty_column_name_is_refused_naming_the_field(field: str, overrides: dict[str, Any]) -> None:
    """An empty name was taken for a column (``id_column=''`` passed): no row has
    it, so every row would have failed at run time instead of the task at once."""
    with pytest.raises(BatchSpecError, match=rf"{field}='' must be a non-empty string"):
        build(**overrides, **{field: ""})


@pytest.mark.parametrize(
    ("model", "kept"),
    [
        ("S3://bucket/model", "s3://bucket/model"),
        ("s3://bucket/model", "s3://bucket/model"),
        ("Org/Model-7B", "Org/Model-7B"),
    ],
)
def test_a_model_uris_scheme_is_kept_lower_case(model: str, kept: str) -> None:
    # "S3://" passed every "s3://" check (the job's S3 settings, its checked model cache) while vLLM,
    # which ignores the case, fetched the model with the node's own settings.
    assert build(model=model).model == kept


@pytest.mark.parametrize(
    "model", ["gs://bucket/model", "AZ://container/model", "http://host/model", "file:///models/m"]
)
def test_a_model_fetched_by_any_scheme_but_s3_is_refused_naming_the_field(model: str) -> None:
    # vLLM fetches gs:// and az:// itself, with the node's own settings and into no checked cache.
    with pytest.raises(
        BatchSpecError, match=r"model=.* uses scheme '(gs|az|http|file)'; use a Hugging Face id"
    ):
        build(model=model)


@pytest.mark.parametrize(
    ("engine_kwargs", "named"),
    [
        ({"tokenizer": "gs://attacker/tok"}, r"engine_kwargs\['tokenizer'\]='gs://attacker/tok'"),
        ({"tokenizer": " az://c/tok"}, r"engine_kwargs\['tokenizer'\]=' az://c/tok'"),
        ({"tokenizer": "S3://bucket/tok"}, r"engine_kwargs\['tokenizer'\]='S3://bucket/tok'"),
        (
            {"speculative_config": {"model": "gs://b/draft"}},
            r"engine_kwargs\['speculative_config'\]\['model'\]",
        ),
        ({"hf_config_path": "https://host/config"}, r"engine_kwargs\['hf_config_path'\]"),
        ({"lora_modules": [{"path": "gs://b/lora"}]}, r"engine_kwargs\['lora_modules'\]\[0\]\['path'\]"),
    ],
)
def test_engine_kwargs_naming_a_remote_source_are_refused_naming_the_key(
    engine_kwargs: dict[str, Any], named: str
) -> None:
    # vLLM pulled engine_kwargs['tokenizer']='gs://...' itself (its code too, for trust_remote_code), with
    # the node's own credentials, outside the checked model cache.
    with pytest.raises(BatchSpecError, match=named + r".* names a remote source"):
        build(engine_kwargs=engine_kwargs)


def test_engine_kwargs_that_send_to_a_url_and_local_folders_are_kept() -> None:
    kwargs = {"otlp_traces_endpoint": "http://collector:4317", "tokenizer": "/models/tok", "max_num_seqs": 8}
    assert build(engine_kwargs=kwargs).engine_kwargs == kwargs
