"""OpenAI batch lines: request bodies -> vLLM requests, engine results -> OpenAI output lines.

The property tests feed random JSON values into every field of a line (hypothesis): a line's fault must
be that line's RequestError, never another exception that fails a batch of millions of lines.
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

import pytest

try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # not importorskip: without hypothesis the property tests must fail, not vanish
    given = settings = st = HealthCheck = None  # type: ignore[assignment]

from airflow_provider_raybatch.pipeline.openai import openai_batch
from airflow_provider_raybatch.pipeline.openai.openai_batch import RequestError
from airflow_provider_raybatch.shared.exceptions import BatchSpecError
from airflow_provider_raybatch.shared.json_numbers import unsafe_number
from airflow_provider_raybatch.shared.openai_endpoints import CHAT, COMPLETIONS, EMBEDDINGS
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec


def chat_line(custom_id: str = "req-1", **body) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT,
        "body": {"model": "any", "messages": [{"role": "user", "content": "Hello"}], **body},
    }


def test_chat_body_maps_to_vllm_sampling_params_over_the_operator_defaults() -> None:
    line = chat_line(
        max_completion_tokens=12,
        temperature=0.5,
        top_p=0.9,
        stop="END",
        seed=7,
        logprobs=True,
        top_logprobs=3,
        presence_penalty=0.1,
        frequency_penalty=0.2,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
    )
    request = openai_batch.parse_request(line, CHAT, {"max_tokens": 99, "top_k": 5})
    params = request["sampling_params"]
    assert request["messages"] == line["body"]["messages"]
    assert params == {
        "top_k": 5,
        "max_tokens": 12,
        "n": 1,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["END"],
        "seed": 7,
        "logprobs": 3,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "structured_outputs": {"json": '{"type": "object"}'},
    }
    assert request["meta"] == {"logprobs": True, "max_tokens": 12}


def test_every_line_gets_the_same_sampling_keys() -> None:
    """Lines of one Ray block must share a schema: unset fields are None, not missing."""
    bare = openai_batch.parse_request(chat_line(), CHAT, {})["sampling_params"]
    full = openai_batch.parse_request(chat_line(seed=1, stop=["x"], max_tokens=3), CHAT, {})[
        "sampling_params"
    ]
    assert set(bare) == set(full)
    assert bare["max_tokens"] is None  # vLLM then generates up to max_model_len, as OpenAI does
    assert bare["temperature"] == 1.0 and bare["structured_outputs"] is None


@pytest.mark.parametrize(
    ("line", "kind", "param"),
    [
        pytest.param({**chat_line(), "url": "/v1/responses"}, "unsupported url", "url", id="other-url"),
        pytest.param({**chat_line(), "method": "GET"}, "unsupported method", "method", id="get"),
        pytest.param(
            chat_line(tools=[{"type": "function"}]), "unsupported parameter", "body.tools", id="tools"
        ),
        pytest.param(chat_line(n=2, temperature=0), "invalid request", "body.n", id="n-2-greedy"),
        pytest.param(chat_line(n=129), "invalid request", "body.n", id="n-129"),
        pytest.param(chat_line(n=0), "invalid request", "body.n", id="n-0"),
        pytest.param(chat_line(best_of=2), "unsupported parameter", "body.best_of", id="best-of"),
        pytest.param(chat_line(temperature=3), "invalid request", "body.temperature", id="temperature"),
        pytest.param(
            chat_line(top_logprobs=2), "invalid request", "body.top_logprobs", id="top-without-logprobs"
        ),
        pytest.param(chat_line(messages=[]), "invalid request", "body.messages", id="no-messages"),
        pytest.param(
            chat_line(messages=[{"role": "user", "content": " "}]),
            "empty prompt",
            "body.messages",
            id="empty",
        ),
        pytest.param(
            chat_line(
                messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
            ),
            "unsupported parameter",
            "body.messages[0].content",
            id="image-part",
        ),
        pytest.param({**chat_line(), "custom_id": ""}, "missing id", "custom_id", id="no-custom-id"),
        pytest.param(
            chat_line(response_format={"type": "json_schema", "json_schema": {}}),
            "invalid request",
            "body.response_format.json_schema.schema",
            id="schema-missing",
        ),
        pytest.param(  # the engine compiles a schema at ~120 us a character: 120 KB took 14.4 s
            chat_line(
                response_format={
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {
                            "type": "object",
                            "properties": {
                                f"p{n}": {"type": "integer", "minimum": n, "maximum": n + 7}
                                for n in range(600)
                            },
                        },
                    },
                }
            ),
            "invalid request",
            "body.response_format.json_schema.schema",
            id="schema-too-long",
        ),
        pytest.param(  # vLLM checks each stop against every new token: 400,000 cost 45 ms a token
            chat_line(stop=[f"s{n}" for n in range(17)]), "invalid request", "body.stop", id="stops-many"
        ),
        pytest.param(chat_line(stop="x" * 1025), "invalid request", "body.stop", id="stop-long"),
        pytest.param(
            chat_line(logprobs=True, top_logprobs=21),
            "invalid request",
            "body.top_logprobs",
            id="top-logprobs",
        ),
    ],
)
def test_a_line_that_cannot_be_served_names_the_field(line: dict, kind: str, param: str) -> None:
    with pytest.raises(RequestError) as caught:
        openai_batch.parse_request(line, CHAT, {})
    assert str(caught.value).startswith(f"{kind}: ")
    assert caught.value.param == param


def test_completions_take_a_prompt_and_integer_logprobs() -> None:
    line = {
        "custom_id": "c",
        "url": COMPLETIONS,
        "method": "POST",
        "body": {"prompt": ["Once"], "logprobs": 2},
    }
    request = openai_batch.parse_request(line, COMPLETIONS, {})
    assert request["prompt"] == "Once" and "messages" not in request
    assert request["sampling_params"]["logprobs"] == 2


def embeddings_line(text_input: object) -> dict:
    return {"custom_id": "e", "url": EMBEDDINGS, "method": "POST", "body": {"input": text_input}}


def test_embeddings_take_one_input_or_several_and_no_sampling() -> None:
    assert openai_batch.parse_request(embeddings_line("text"), EMBEDDINGS, {}) == {
        "prompt": "text",
        "meta": {"encoding_format": "float"},
    }
    assert openai_batch.parse_request(embeddings_line(["text"]), EMBEDDINGS, {})["prompt"] == "text"
    many = openai_batch.parse_request(embeddings_line(["a", "b", "c"]), EMBEDDINGS, {})
    assert (many["prompt"], many[openai_batch.EXTRA_INPUTS]) == ("a", ["b", "c"])  # the row's prompt: the 1st


@pytest.mark.parametrize(
    ("text_input", "kind", "param"),
    [
        pytest.param([[1, 2], [3]], "unsupported parameter", "body.input", id="token-id-lists"),
        pytest.param([1, 2, 3], "unsupported parameter", "body.input", id="token-ids"),
        pytest.param([], "invalid request", "body.input", id="no-inputs"),
        pytest.param(["a", " "], "empty prompt", "body.input[1]", id="one-empty"),
        pytest.param(["a"] * 2049, "invalid request", "body.input", id="over-2048"),
    ],
)
def test_embeddings_refuse_token_ids_and_empty_inputs(text_input: object, kind: str, param: str) -> None:
    with pytest.raises(RequestError) as caught:
        openai_batch.parse_request(embeddings_line(text_input), EMBEDDINGS, {})
    assert str(caught.value).startswith(f"{kind}: ") and caught.value.param == param


def test_n_is_an_int_on_every_line_from_the_body_the_defaults_or_1() -> None:
    """Never None: vLLM takes no None for n, and a block's ints with a null turn into floats."""
    assert openai_batch.parse_request(chat_line(), CHAT, {})["sampling_params"]["n"] == 1
    assert openai_batch.parse_request(chat_line(), CHAT, {"n": 2})["sampling_params"]["n"] == 2
    assert openai_batch.parse_request(chat_line(n=3), CHAT, {"n": 2})["sampling_params"]["n"] == 3
    requests = [json.dumps(openai_batch.parse_request(chat_line(n=k), CHAT, {})) for k in (1, 4)]
    requests.append(json.dumps(openai_batch.parse_request(chat_line(), CHAT, {})))
    assert "n" not in openai_batch.fields_to_fill(requests)


def engine_row(request: dict, **fields) -> dict:
    return {
        "id": "req-1",
        "source": "in.jsonl:1",
        "request": json.dumps(request),
        "num_input_tokens": 5,
        **fields,
    }


def test_chat_response_line_has_openai_shape_usage_and_finish_reason() -> None:
    request = openai_batch.parse_request(chat_line(max_tokens=4), CHAT, {})
    row = engine_row(request, generated_text="Hi there", num_generated_tokens=4, logprobs=None)
    line = openai_batch.response_line(row, CHAT, "tiny", "run-1")
    assert line["custom_id"] == "req-1" and line["error"] is None and line["id"].startswith("batch_req_")
    response = line["response"]
    assert response["status_code"] == 200
    body = response["body"]
    assert body["object"] == "chat.completion" and body["model"] == "tiny"
    assert body["choices"] == [
        {
            "index": 0,
            "finish_reason": "length",
            "message": {"role": "assistant", "content": "Hi there"},
            "logprobs": None,
        }
    ]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    again = openai_batch.response_line(row, CHAT, "tiny", "run-1")
    assert again["id"] == line["id"] and again["response"]["request_id"] == response["request_id"]  # stable


def steps_of(*tokens: str) -> list[dict]:
    return [{"token": token, "logprob": -0.5, "top": [{"token": token, "logprob": -0.5}]} for token in tokens]


def test_n_choices_each_with_its_text_finish_reason_and_logprobs_and_usage_summed() -> None:
    request = openai_batch.parse_request(chat_line(n=3, max_tokens=2, logprobs=True), CHAT, {})
    extra = [openai_batch.choice_record("b", 1, steps_of("b"))]
    extra.append(openai_batch.choice_record("c d", 2, steps_of("c", " d")))
    row = engine_row(
        request,
        generated_text="a",
        num_generated_tokens=1,
        logprobs=json.dumps(steps_of("a")),
        extra_choices=json.dumps(extra),
    )
    body = openai_batch.response_line(row, CHAT, "tiny", "run-1")["response"]["body"]
    assert [choice["index"] for choice in body["choices"]] == [0, 1, 2]
    assert [choice["message"]["content"] for choice in body["choices"]] == ["a", "b", "c d"]
    assert [choice["finish_reason"] for choice in body["choices"]] == ["stop", "stop", "length"]
    assert [[step["token"] for step in choice["logprobs"]["content"]] for choice in body["choices"]] == [
        ["a"],
        ["b"],
        ["c", " d"],
    ]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    line = openai_batch.response_line(row, CHAT, "tiny", "run-1")
    assert openai_batch.token_counts(line) == (5, 4)


def test_n_completions_without_logprobs_asked_show_none() -> None:
    completion = {"custom_id": "c", "url": COMPLETIONS, "body": {"prompt": "x", "n": 2, "temperature": 1}}
    request = openai_batch.parse_request(completion, COMPLETIONS, {})
    # Filled logprobs (see filled_sampling_params) come back, but the line did not ask for them.
    extra = [openai_batch.choice_record("second", 3, steps_of("se", "co", "nd"))]
    row = engine_row(
        request,
        generated_text="first",
        num_generated_tokens=2,
        logprobs=None,
        extra_choices=json.dumps(extra),
    )
    body = openai_batch.response_line(row, COMPLETIONS, "m", "r")["response"]["body"]
    assert body["object"] == "text_completion"
    assert [(c["index"], c["text"], c["logprobs"]) for c in body["choices"]] == [
        (0, "first", None),
        (1, "second", None),
    ]
    assert body["usage"]["completion_tokens"] == 5


def test_logprobs_pick_the_generated_token_and_rank_the_alternatives() -> None:
    raw = [
        {
            11: {"logprob": -0.5, "rank": 2, "decoded_token": "a"},
            12: {"logprob": -0.1, "rank": 1, "decoded_token": "b"},
        }
    ]
    steps = openai_batch.token_logprobs(raw, [11])
    assert steps == [
        {
            "token": "a",
            "logprob": -0.5,
            "top": [{"token": "b", "logprob": -0.1}, {"token": "a", "logprob": -0.5}],
        }
    ]
    request = openai_batch.parse_request(chat_line(logprobs=True, top_logprobs=1), CHAT, {})
    row = engine_row(request, generated_text="a", num_generated_tokens=1, logprobs=json.dumps(steps))
    content = openai_batch.response_line(row, CHAT, "m", "r")["response"]["body"]["choices"][0]["logprobs"][
        "content"
    ]
    assert content[0]["token"] == "a" and content[0]["bytes"] == [97] and len(content[0]["top_logprobs"]) == 2
    completion = openai_batch.parse_request(
        {"custom_id": "c", "url": COMPLETIONS, "body": {"prompt": "x", "logprobs": 1}}, COMPLETIONS, {}
    )
    row = engine_row(completion, generated_text="a", num_generated_tokens=1, logprobs=json.dumps(steps))
    logprobs = openai_batch.response_line(row, COMPLETIONS, "m", "r")["response"]["body"]["choices"][0][
        "logprobs"
    ]
    assert logprobs == {
        "tokens": ["a"],
        "token_logprobs": [-0.5],
        "top_logprobs": [{"b": -0.1, "a": -0.5}],
        "text_offset": [0],
    }


def test_k_inputs_give_k_embeddings_in_order_and_usage_summed() -> None:
    extra = [openai_batch.embedding_record([0.25, 0.0], 3), openai_batch.embedding_record([-2.0, 1.5], 4)]
    for encoding in ("float", "base64"):
        line = embeddings_line(["a", "b", "c"])
        line["body"]["encoding_format"] = encoding
        request = openai_batch.parse_request(line, EMBEDDINGS, {})
        row = engine_row(request, embeddings=[0.5, -1.0], extra_embeddings=json.dumps(extra))
        body = openai_batch.response_line(row, EMBEDDINGS, "m", "r")["response"]["body"]
        assert {item["object"] for item in body["data"]} == {"embedding"}
        assert [item["index"] for item in body["data"]] == [0, 1, 2]
        vectors = [entry["embedding"] for entry in body["data"]]
        if encoding == "base64":
            vectors = [list(struct.unpack("<2f", base64.b64decode(vector))) for vector in vectors]
        assert vectors == [[0.5, -1.0], [0.25, 0.0], [-2.0, 1.5]]
        assert body["usage"] == {"prompt_tokens": 12, "total_tokens": 12}


def test_embedding_line_in_float_and_base64() -> None:
    row = engine_row({"prompt": "t", "meta": {"encoding_format": "base64"}}, embeddings=[0.5, -1.0])
    body = openai_batch.response_line(row, EMBEDDINGS, "m", "r")["response"]["body"]
    assert struct.unpack("<2f", base64.b64decode(body["data"][0]["embedding"])) == (0.5, -1.0)
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    assert openai_batch.token_counts(openai_batch.response_line(row, EMBEDDINGS, "m", "r")) == (5, 0)


def test_error_line_carries_code_reason_and_line() -> None:
    line = openai_batch.error_line(
        None, "batch.jsonl:3", "malformed JSON: line 3, column 2: Expecting value", "r"
    )
    assert line["custom_id"] is None and line["response"] is None
    assert line["error"]["code"] == "invalid_json"
    assert line["error"]["message"].endswith("(line batch.jsonl:3)")
    assert openai_batch.error_reason(line) == "malformed JSON: line 3, column 2: Expecting value"
    assert (
        openai_batch.error_line("x", "b:1", "duplicate id: 'x' first seen at b:0", "r")["error"]["code"]
        == "duplicate_custom_id"
    )


def spec(**overrides) -> BatchInferenceSpec:
    return BatchInferenceSpec.build(
        **{"model": "m", "input_uri": "/in/batch.jsonl", "output_uri": "/out", **overrides}
    )


def test_spec_with_an_openai_endpoint_reads_and_writes_jsonl() -> None:
    openai_spec = spec(openai_endpoint=CHAT)
    assert openai_spec.output_format == "jsonl" and openai_spec.resolved_input_format == "jsonl"
    assert spec(openai_endpoint=CHAT, input_uri="/in/requests.txt").resolved_input_format == "jsonl"


@pytest.mark.parametrize(
    "overrides",
    [{"user_template": "{x}"}, {"id_column": "id"}, {"output_format": "parquet"}, {"postprocess": "m.f"}],
)
def test_spec_refuses_row_fields_with_an_openai_endpoint(overrides: dict) -> None:
    with pytest.raises(BatchSpecError, match=next(iter(overrides))):
        spec(openai_endpoint=CHAT, **overrides)


def test_int_fields_set_on_some_lines_are_set_on_all_to_values_that_change_nothing() -> None:
    """Ray Data would turn a block's ints into floats where some lines leave them None (vLLM then hangs)."""
    requests = [
        json.dumps(openai_batch.parse_request(chat_line("a", seed=5, max_tokens=3), CHAT, {})),
        json.dumps(openai_batch.parse_request(chat_line("b"), CHAT, {})),
        None,  # a rejected line
    ]
    fill = openai_batch.fields_to_fill(requests)
    assert fill == {"seed", "max_tokens"}  # nobody asked for logprobs: left None on every line
    bare = json.loads(requests[1])["sampling_params"]
    filled = openai_batch.filled_sampling_params(bare, fill, "batch.jsonl:2")
    assert filled["max_tokens"] == openai_batch.UNBOUNDED_MAX_TOKENS and filled["logprobs"] is None
    assert isinstance(filled["seed"], int) and filled == openai_batch.filled_sampling_params(
        bare, fill, "batch.jsonl:2"
    )
    assert filled["seed"] != openai_batch.filled_sampling_params(bare, fill, "batch.jsonl:3")["seed"]
    kept = openai_batch.filled_sampling_params(
        json.loads(requests[0])["sampling_params"], fill, "batch.jsonl:1"
    )
    assert (kept["seed"], kept["max_tokens"]) == (5, 3)
    assert openai_batch.filled_sampling_params(bare, frozenset({"logprobs"}), "s")["logprobs"] == 0


def test_finish_reason_is_vllms_own_where_the_engine_row_has_it() -> None:
    """vLLM's reason wins over the token count (a stop string on the last allowed token is "stop");
    without one (an older row), the count decides; a reason OpenAI lacks ("abort") is not passed on."""
    request = openai_batch.parse_request(chat_line(n=2, max_tokens=2, temperature=1), CHAT, {})
    extra = [openai_batch.choice_record("b", 1, None, "length")]
    row = engine_row(
        request,
        generated_text="a b",
        num_generated_tokens=2,
        logprobs=None,
        finish_reason="stop",
        extra_choices=json.dumps(extra),
    )
    body = openai_batch.response_line(row, CHAT, "tiny", "run-1")["response"]["body"]
    assert [choice["finish_reason"] for choice in body["choices"]] == ["stop", "length"]
    for known, expected in ((None, "length"), ("abort", "length")):
        row = engine_row(request, generated_text="a b", num_generated_tokens=2, logprobs=None)
        row["finish_reason"] = known
        body = openai_batch.response_line(row, CHAT, "tiny", "run-1")["response"]["body"]
        assert body["choices"][0]["finish_reason"] == expected


# -- a malformed line is that line's RequestError, whatever it holds --------------------------------


def deep(depth: int) -> dict[str, Any]:  # Any: JSON.
    value: dict[str, Any] = {}  # Any: JSON.
    for _ in range(depth):
        value = {"a": value}
    return value


DEEP_SCHEMA = {"name": "deep", "schema": deep(5000)}  # deeper than json.dumps goes


@pytest.mark.parametrize(
    ("line", "kind", "param", "detail"),
    [
        pytest.param(
            chat_line(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, 5]}]),
            "invalid request",
            "body.messages[0].content",
            "content[1] must be an object",
            id="part-int",
        ),
        pytest.param(
            chat_line(messages=[{"role": "user", "content": []}]),
            "invalid request",
            "body.messages[0].content",
            "non-empty list",
            id="parts-empty",
        ),
        pytest.param(
            chat_line(messages=[{"role": "user", "content": ["hello"]}]),
            "invalid request",
            "body.messages[0].content",
            "content[0] must be an object",
            id="part-str",
        ),
        pytest.param(
            chat_line(messages=[{"role": "user", "content": [{"type": ["text"]}]}]),
            "unsupported parameter",
            "body.messages[0].content",
            "content[0] has type ['text']",
            id="part-type-unhashable",
        ),
        pytest.param(
            chat_line(messages=[{"role": "user", "content": [{"type": "text", "text": {"a": 1}}]}]),
            "invalid request",
            "body.messages[0].content",
            "content[0].text must be a string",
            id="part-text-not-text",
        ),
        pytest.param(
            chat_line(messages=[{"role": "user", "content": [{"type": "text"}]}]),
            "invalid request",
            "body.messages[0].content",
            "content[0].text must be a string",
            id="part-without-text",
        ),
        pytest.param(
            chat_line(response_format={"type": "json_schema", "json_schema": "text"}),
            "invalid request",
            "body.response_format.json_schema",
            "must be an object",
            id="json-schema-text",
        ),
        pytest.param(
            chat_line(response_format={"type": "json_schema", "json_schema": [1]}),
            "invalid request",
            "body.response_format.json_schema",
            "must be an object",
            id="json-schema-list",
        ),
        pytest.param(
            chat_line(response_format={"type": {"a": 1}}),
            "unsupported parameter",
            "body.response_format",
            "type {'a': 1}",
            id="format-type-dict",
        ),
        pytest.param(
            chat_line(response_format={"type": "json_schema", "json_schema": DEEP_SCHEMA}),
            "invalid request",
            "body.response_format.json_schema.schema",
            "nested too deeply",
            id="schema-too-deep",
        ),
        pytest.param(
            chat_line(max_tokens=10**30), "invalid request", "body.max_tokens", "integer", id="huge-int"
        ),
        pytest.param(chat_line(seed=2**64), "invalid request", "body.seed", "integer", id="seed-over-int64"),
        pytest.param(
            chat_line(
                response_format={"type": "json_schema", "json_schema": {"schema": {"maxItems": 2**64}}}
            ),
            "invalid request",
            "body.response_format.json_schema.schema.maxItems",
            "18446744073709551616 is out of range",
            id="schema-int-over-int64",
        ),
        pytest.param(
            chat_line(messages=[{"role": "user", "content": "hi", "weight": float("nan")}]),
            "invalid request",
            "body.messages[0].weight",
            "nan is not a finite number",
            id="nan-in-a-message",
        ),
        pytest.param(
            chat_line(metadata={"x": float("-inf")}),
            "invalid request",
            "body.metadata.x",
            "-inf is not a finite number",
            id="infinity-in-an-ignored-field",
        ),
        pytest.param(
            chat_line(top_logprobs=10**20, logprobs=True),
            "invalid request",
            "body.top_logprobs",
            "",
            id="huge-top-logprobs",
        ),
        pytest.param(
            {**chat_line(), "method": "x" * 10_000}, "unsupported method", "method", "...", id="long-method"
        ),
        pytest.param(
            chat_line(**{"x" * 10_000: 1}), "unsupported parameter", None, "...", id="long-field-name"
        ),
    ],
)
def test_a_malformed_line_is_a_request_error_naming_the_field(
    line: dict, kind: str, param: str | None, detail: str
) -> None:
    with pytest.raises(RequestError) as caught:
        openai_batch.parse_request(line, CHAT, {})

    reason = str(caught.value)
    assert reason.startswith(f"{kind}: ") and detail in reason
    assert len(reason) < 300  # long values are shortened, not dumped into the error file
    if param is not None:
        assert caught.value.param == param


@pytest.mark.parametrize("line", [None, 42, "text", [1, 2], ["custom_id"]])
def test_a_line_that_is_not_an_object_is_a_request_error(line: Any) -> None:  # Any: any JSON value.
    for call in (lambda: openai_batch.custom_id_of(line), lambda: openai_batch.parse_request(line, CHAT, {})):
        with pytest.raises(RequestError, match="^not a JSON object: "):
            call()


def json_values() -> Any:  # Any: a hypothesis strategy.
    """Any JSON value, as json.loads gives them (NaN and infinities included: Python's parser takes them)."""
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
    return st.recursive(scalars, lambda c: st.lists(c) | st.dictionaries(st.text(), c), max_leaves=20)


BASE_BODIES = {
    CHAT: {"model": "m", "messages": [{"role": "user", "content": "Hello"}]},
    COMPLETIONS: {"model": "m", "prompt": "Once"},
    EMBEDDINGS: {"model": "m", "input": "text"},
}
#: Each endpoint's honoured fields, one ignored field, stream (ignored unless true) and one unknown field.
FIELDS = {
    endpoint: sorted(openai_batch._HONOURED_FIELDS[endpoint] | {"model", "stream", "tools"})
    for endpoint in BASE_BODIES
}


def served_or_refused(line: Any, endpoint: str) -> None:  # Any: any JSON value.
    """parse_request either serves the line (as JSON the pipeline can carry) or refuses it with a reason."""
    try:
        request = openai_batch.parse_request(line, endpoint, {})
    except RequestError as err:
        reason = str(err)
        kind, sep, detail = reason.partition(": ")
        assert sep and kind.strip() and detail.strip(), reason
        assert len(reason) < 400, reason
        return
    json.dumps(request, ensure_ascii=False)
    # Nothing the engine takes as a number is past int64, NaN or infinite (the line fails instead).
    assert unsafe_number(request, "request") is None, request


def _needs_hypothesis() -> None:
    if given is None:
        pytest.fail(
            "hypothesis is not importable here: add 'hypothesis>=6' to the [test] extra in pyproject.toml."
        )


@pytest.mark.parametrize(
    ("endpoint", "field"), [(endpoint, field) for endpoint in BASE_BODIES for field in FIELDS[endpoint]]
)
def test_any_value_in_any_body_field_is_served_or_refused(endpoint: str, field: str) -> None:
    _needs_hypothesis()

    # 100 values for each of the ~40 fields (300 took two minutes of CI's unit pass); each
    # run draws new ones (no example database), so runs add up.
    @settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(value=json_values())
    def check(value: Any) -> None:  # Any: any JSON value.
        body = {**BASE_BODIES[endpoint], field: value}
        served_or_refused({"custom_id": "c", "method": "POST", "url": endpoint, "body": body}, endpoint)

    check()


def test_any_value_inside_a_chat_message_is_served_or_refused() -> None:
    _needs_hypothesis()
    message_values = st.fixed_dictionaries({}, optional={"role": json_values(), "content": json_values()})
    parts = st.lists(
        st.fixed_dictionaries({}, optional={"type": json_values() | st.just("text"), "text": json_values()})
        | json_values()
    )

    @settings(max_examples=300, deadline=None, database=None)
    @given(message=message_values | json_values(), content=parts)
    def check(message: Any, content: Any) -> None:  # Any: any JSON value.
        messages = [{"role": "user", "content": content}, message]  # the parts first: checked first
        served_or_refused(chat_line(messages=messages), CHAT)

    check()


def test_any_response_format_is_served_or_refused() -> None:
    _needs_hypothesis()
    formats = st.fixed_dictionaries(
        {"type": st.sampled_from(["json_schema", "json_object", "text"]) | json_values()},
        optional={
            "json_schema": json_values() | st.fixed_dictionaries({}, optional={"schema": json_values()})
        },
    )

    @settings(max_examples=300, deadline=None, database=None)
    @given(response_format=formats | json_values())
    def check(response_format: Any) -> None:  # Any: any JSON value.
        served_or_refused(chat_line(response_format=response_format), CHAT)

    check()


def test_any_line_is_served_or_refused() -> None:
    _needs_hypothesis()
    keys = st.sampled_from(["custom_id", "method", "url", "body"]) | st.text()

    @settings(max_examples=300, deadline=None, database=None)
    @given(
        line=st.dictionaries(keys, json_values()) | json_values(), endpoint=st.sampled_from(list(BASE_BODIES))
    )
    def check(line: Any, endpoint: str) -> None:  # Any: any JSON value.
        try:
            openai_batch.custom_id_of(line)
        except RequestError as err:
            assert str(err).split(": ", 1)[1]
        served_or_refused(line, endpoint)

    check()
