"""OpenAI batch files through the real pipeline: chat, completions and embeddings on vLLM's CPU engine.

Each test submits the job exactly as the operator does and reads the committed OpenAI output and
error files: every custom_id exactly once in one of them, bodies in OpenAI's shape, counts adding up.
"""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path

import pytest

from airflow_provider_raybatch.hooks.ray import JobStatus, RayHook
from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator
from airflow_provider_raybatch.shared.openai_endpoints import CHAT, COMPLETIONS, EMBEDDINGS
from tests.conftest import CPU_ENGINE_KWARGS, CPU_REPLICA, submit_pipeline, wait_for_job, warm_conf

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


def request(custom_id: str, url: str, body: dict) -> str:
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": "tiny", **body}}
    )


def run_batch(
    tiny_model: Path,
    tmp_path: Path,
    endpoint: str,
    lines: list[str],
    runtime_env: dict | None = None,
    keep_warm_seconds: float | None = None,
    **engine_kwargs,
) -> tuple[dict, list, list]:
    """Write ``lines`` as a batch file, run it, return (manifest, output lines, error lines)."""
    input_path = tmp_path / "in" / "batch.jsonl"
    input_path.parent.mkdir()
    input_path.write_text("\n".join(lines) + "\n")
    output_uri = str(tmp_path / "out")
    operator = RayLLMBatchOperator(
        task_id="openai_batch",
        model=str(tiny_model),
        input_uri=str(input_path),
        output_uri=output_uri,
        openai_endpoint=endpoint,
        sampling_params={"temperature": 0, "max_tokens": 8},
        engine_kwargs={**CPU_ENGINE_KWARGS, **engine_kwargs},
        replica_resources=CPU_REPLICA,
        batch_size=16,
        runtime_env=runtime_env or {},
        max_failed_fraction=1.0,  # as the Batch API's DAG (openai_api/dag.py): failed lines are its errors
        keep_warm_seconds=keep_warm_seconds,
    )
    job_id = submit_pipeline(operator, "openai", f"openai-test-{uuid.uuid4().hex[:8]}")
    assert wait_for_job(job_id) == JobStatus.SUCCEEDED, RayHook().get_job_log_tail(job_id, 80)
    manifest = json.loads(Path(output_uri, "manifest.json").read_text())
    return manifest, _lines(manifest["outputs_uri"]), _lines(manifest["errors_uri"])


def _lines(folder: str) -> list[dict]:
    return [
        json.loads(line)
        for path in sorted(Path(folder).glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def assert_counts_add_up(manifest: dict, outputs: list, errors: list, total: int) -> None:
    assert manifest["request_counts"] == {"total": total, "completed": len(outputs), "failed": len(errors)}
    assert manifest["rows_in"] == manifest["rows_out"] + manifest["rows_failed"] == total


def test_chat_completions_batch(ray_connection, tiny_model, tmp_path) -> None:
    good = [
        request(
            f"plain-{i}",
            CHAT,
            {"messages": [{"role": "user", "content": f"Say {i}"}], "max_tokens": 3 + i % 4},
        )
        for i in range(12)
    ]
    # n=3 in the same block as one-choice lines; sampled (n > 1 needs temperature > 0), seeded.
    good.insert(
        5,
        request(
            "three-choices",
            CHAT,
            {
                "messages": [{"role": "user", "content": "Hi"}],
                "n": 3,
                "temperature": 1.0,
                "seed": 11,
                "max_tokens": 6,
                "logprobs": True,
            },
        ),
    )
    good += [
        request(
            "logprobs",
            CHAT,
            {"messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 2},
        ),
        request(
            "seeded", CHAT, {"messages": [{"role": "user", "content": "Hi"}], "temperature": 1.0, "seed": 3}
        ),
        request(
            "stop",
            CHAT,
            {"messages": [{"role": "user", "content": "Hi"}], "stop": ["\n"], "max_completion_tokens": 6},
        ),
    ]
    good += [
        request(
            f"schema-{i}",
            CHAT,
            {
                "messages": [{"role": "user", "content": f"JSON please {i}"}],
                "max_tokens": 40,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "answer", "schema": SCHEMA},
                },
            },
        )
        for i in range(4)
    ]
    bad = {
        "other-url": request("other-url", COMPLETIONS, {"prompt": "x"}),
        "greedy-choices": request(
            "greedy-choices", CHAT, {"messages": [{"role": "user", "content": "x"}], "n": 2}
        ),
        "best-of": request("best-of", CHAT, {"messages": [{"role": "user", "content": "x"}], "best_of": 2}),
        "tools": request("tools", CHAT, {"messages": [{"role": "user", "content": "x"}], "tools": []}),
        # duplicate
        "plain-0": request("plain-0", CHAT, {"messages": [{"role": "user", "content": "again"}]}),
        None: '{"custom_id": "broken", "body": {',  # malformed: no custom_id can be read
    }
    # On the session's warm engines (CPU_ENGINE_KWARGS: compact JSON, which this test's grammar needs).
    manifest, outputs, errors = run_batch(
        tiny_model, tmp_path, CHAT, good + list(bad.values()), **warm_conf()
    )

    assert_counts_add_up(manifest, outputs, errors, len(good) + len(bad))
    by_id = {line["custom_id"]: line for line in outputs}
    assert len(by_id) == len(outputs) == len(good)  # each custom_id once
    for line in outputs:
        assert line["id"].startswith("batch_req_") and line["error"] is None
        response = line["response"]
        assert response["status_code"] == 200 and response["request_id"].startswith("req_")
        body = response["body"]
        assert body["object"] == "chat.completion" and body["model"] == str(tiny_model)
        assert [choice["index"] for choice in body["choices"]] == list(range(len(body["choices"])))
        for choice in body["choices"]:
            assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
        usage = body["usage"]
        assert (
            usage["prompt_tokens"] > 0
            and usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        )
    for i in range(12):  # the body's max_tokens, not the operator's 8
        choice, usage = (
            by_id[f"plain-{i}"]["response"]["body"]["choices"][0],
            by_id[f"plain-{i}"]["response"]["body"]["usage"],
        )
        assert usage["completion_tokens"] <= 3 + i % 4
        assert choice["finish_reason"] == ("length" if usage["completion_tokens"] == 3 + i % 4 else "stop")
    logprobs = by_id["logprobs"]["response"]["body"]["choices"][0]["logprobs"]["content"]
    assert len(logprobs) == by_id["logprobs"]["response"]["body"]["usage"]["completion_tokens"] > 0
    assert all(step["logprob"] <= 0 and 1 <= len(step["top_logprobs"]) <= 3 for step in logprobs)
    three = by_id["three-choices"]["response"]["body"]
    assert len(three["choices"]) == 3 and [choice["index"] for choice in three["choices"]] == [0, 1, 2]
    tokens = [len(choice["logprobs"]["content"]) for choice in three["choices"]]  # a step per token
    assert all(0 < count <= 6 for count in tokens) and three["usage"]["completion_tokens"] == sum(tokens)
    for choice, count in zip(three["choices"], tokens, strict=True):
        assert choice["finish_reason"] == ("length" if count == 6 else "stop")
    assert all(len(by_id[i]["response"]["body"]["choices"]) == 1 for i in by_id if i != "three-choices")
    assert "\n" not in by_id["stop"]["response"]["body"]["choices"][0]["message"]["content"]
    schema_answers = [by_id[f"schema-{i}"]["response"]["body"]["choices"][0] for i in range(4)]
    finished = [
        json.loads(choice["message"]["content"])
        for choice in schema_answers
        if choice["finish_reason"] == "stop"
    ]
    assert finished, "structured output never finished within 40 tokens"
    assert all(set(answer) == {"ok"} and isinstance(answer["ok"], bool) for answer in finished)

    codes = {line["custom_id"]: line["error"]["code"] for line in errors}
    assert codes == {
        "other-url": "invalid_url",
        "greedy-choices": "invalid_request",
        "best-of": "unsupported_parameter",
        "tools": "unsupported_parameter",
        "plain-0": "duplicate_custom_id",
        None: "invalid_json",
    }
    assert all(
        line["response"] is None and "(line batch.jsonl:" in line["error"]["message"] for line in errors
    )
    assert manifest["errors_by_reason"] == {
        "duplicate id": 1,
        "invalid request": 1,
        "malformed JSON": 1,
        "unsupported parameter": 2,
        "unsupported url": 1,
    }
    assert manifest["tokens_out"] == sum(
        line["response"]["body"]["usage"]["completion_tokens"] for line in outputs
    )


def test_completions_batch_with_logprobs(ray_connection, tiny_model, tmp_path) -> None:
    """Also: two choices for one line. On the session's warm engines, which the chat jobs built: the
    pool is the model's and the engine's settings', and a completions job has no chat template."""
    lines = [
        request(f"c-{i}", COMPLETIONS, {"prompt": f"Once upon a time {i}", "max_tokens": 5, "logprobs": 1})
        for i in range(10)
    ]
    lines.insert(
        3,
        request(
            "c-two",
            COMPLETIONS,
            {"prompt": "Once", "max_tokens": 5, "logprobs": 1, "n": 2, "temperature": 1.0},
        ),
    )
    lines.append(request("c-empty", COMPLETIONS, {"prompt": "   "}))
    manifest, outputs, errors = run_batch(tiny_model, tmp_path, COMPLETIONS, lines, **warm_conf())

    assert_counts_add_up(manifest, outputs, errors, 12)
    if warm_conf():  # on the pool the chat jobs left warm (test_warm_pool's, or this file's chat test)
        assert manifest["engine_pool"]["warm_replicas"] == 1, (
            "a completions job built an engine of its own beside the chat jobs' warm one",
            manifest["engine_pool"],
        )
    assert sorted(line["custom_id"] for line in outputs) == sorted([*(f"c-{i}" for i in range(10)), "c-two"])
    for line in outputs:
        body = line["response"]["body"]
        assert body["object"] == "text_completion"
        assert (
            [choice["index"] for choice in body["choices"]] == [0, 1] if line["custom_id"] == "c-two" else [0]
        )
        for choice in body["choices"]:
            logprobs = choice["logprobs"]
            assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) > 0
            if line["custom_id"] != "c-two":  # sampled, the random model may split a character over tokens
                assert "".join(logprobs["tokens"]) == choice["text"]
            assert logprobs["text_offset"][0] == 0
        assert body["usage"]["completion_tokens"] == sum(
            len(c["logprobs"]["tokens"]) for c in body["choices"]
        )
    assert [line["custom_id"] for line in errors] == ["c-empty"]
    assert errors[0]["error"]["code"] == "invalid_request" and "empty prompt" in errors[0]["error"]["message"]


@pytest.mark.cold_engine  # an embedding engine, built with the forkserver off: no other test makes either
def test_embeddings_batch(ray_connection, tiny_model, tmp_path) -> None:
    """Also: the engine started with the forkserver off (its EngineCore spawned by the replica itself;
    our engine-stage UDF serves the stage either way, pipeline/generate/stage_swap.py)."""
    lines = [request(f"e-{i}", EMBEDDINGS, {"input": f"document number {i}"}) for i in range(8)]
    # Three inputs in one line, in the same block as one-input lines; two of them also sent alone.
    lines.insert(
        4,
        request("e-three", EMBEDDINGS, {"input": ["document number 5", "a third text", "document number 1"]}),
    )
    lines.append(request("e-ids", EMBEDDINGS, {"input": [[1, 2, 3]]}))  # token ids: still refused
    no_forkserver = {"env_vars": {"RAYBATCH_ENGINE_FORKSERVER": "0"}}
    manifest, outputs, errors = run_batch(tiny_model, tmp_path, EMBEDDINGS, lines, runtime_env=no_forkserver)

    assert_counts_add_up(manifest, outputs, errors, 10)
    vectors, usage = {}, {}
    for line in outputs:
        body = line["response"]["body"]
        assert body["object"] == "list" and {item["object"] for item in body["data"]} == {"embedding"}
        assert [item["index"] for item in body["data"]] == list(range(len(body["data"])))
        assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
        vectors[line["custom_id"]] = [item["embedding"] for item in body["data"]]
        usage[line["custom_id"]] = body["usage"]["prompt_tokens"]
    assert sorted(vectors) == sorted([*(f"e-{i}" for i in range(8)), "e-three"])
    assert {len(found) for key, found in vectors.items() if key != "e-three"} == {1} and len(
        vectors["e-three"]
    ) == 3
    every = [vector for found in vectors.values() for vector in found]
    assert {len(vector) for vector in every} == {128}  # the tiny model's hidden size
    assert all(math.isfinite(x) for vector in every for x in vector)
    assert vectors["e-0"] != vectors["e-1"]
    three = vectors["e-three"]
    assert three[0] != three[1] != three[2] != three[0]
    # In order: the first and last inputs embed as the same texts sent alone (CPU batches may differ a
    # little).
    for mine, alone in ((three[0], vectors["e-5"][0]), (three[2], vectors["e-1"][0])):
        assert mine == pytest.approx(alone, rel=1e-3, abs=1e-4)
    assert usage["e-three"] > usage["e-5"] + usage["e-1"]  # the middle input's tokens counted too
    assert [(line["custom_id"], line["error"]["code"]) for line in errors] == [
        ("e-ids", "unsupported_parameter")
    ]
