"""OpenAI batch files: a request line in, a response line out, joined by ``custom_id``.

A request line is ``{"custom_id", "method": "POST", "url", "body"}``, OpenAI's batch input format.
:func:`parse_request` turns it into what ray.data.llm's engine stage takes (chat messages or a
prompt, and vLLM sampling parameters), or raises :class:`RequestError` naming the field at fault, so
that one bad line fails alone. :func:`response_line` and :func:`error_line` write OpenAI's batch
output format. Pure functions of a line, unit-tested without Ray.

One line stays one engine row: its ``n`` choices come back from one vLLM request, and the inputs of a
multi-input embeddings line after the first travel as the row's ``extra_inputs`` (see
:mod:`~airflow_provider_raybatch.pipeline.generate.engine_actor`, which serves both).
"""

from __future__ import annotations

import base64
import hashlib
import json
import reprlib
import struct
import time
from collections.abc import Iterable, Mapping, Sequence

from airflow_provider_raybatch.pipeline.row_marks import MAX_ID_CHARS
from airflow_provider_raybatch.shared.json_numbers import unsafe_number
from airflow_provider_raybatch.shared.json_types import ArgValue, CellValue, JsonObject, JsonValue, Kwargs
from airflow_provider_raybatch.shared.openai_endpoints import CHAT, COMPLETIONS, EMBEDDINGS

#: Body fields accepted without effect: the batch's model is the operator's, and the rest is bookkeeping.
_IGNORED_FIELDS = frozenset({"model", "user", "metadata", "store", "service_tier", "stream"})
#: Body fields honoured, per endpoint, besides the prompt itself.
_HONOURED_FIELDS = {
    CHAT: frozenset(
        """
        messages max_tokens max_completion_tokens temperature top_p stop seed n logprobs top_logprobs
        response_format presence_penalty frequency_penalty
        """.split()
    ),
    COMPLETIONS: frozenset(
        """
        prompt max_tokens temperature top_p stop seed n logprobs echo presence_penalty frequency_penalty
        """.split()
    ),
    EMBEDDINGS: frozenset({"input", "encoding_format"}),
}
#: What a line's error kind (the words before the first colon of its reason) is called in OpenAI's
#: ``error.code``; any other kind is an ``invalid_request``.
_ERROR_CODES = {
    "malformed JSON": "invalid_json",
    "invalid UTF-8": "invalid_json",
    "not a JSON object": "invalid_json",
    "duplicate id": "duplicate_custom_id",
    "unsupported url": "invalid_url",
    "unsupported method": "invalid_method",
    "unsupported parameter": "unsupported_parameter",
    "inference failed": "server_error",
}


#: SamplingParams fields that are an int or None. Ray Data hands a block's rows to the engine stage
#: through pandas, where an int column with a null turns every int in it into a float, which vLLM's
#: engine refuses (and then hangs). So a field that some lines of a batch set is set on all of them,
#: to a value that changes nothing: see :func:`fields_to_fill` and :func:`filled_sampling_params`.
NULLABLE_INT_FIELDS = ("max_tokens", "seed", "logprobs")
#: A max_tokens that never binds: vLLM stops at max_model_len first, as with max_tokens unset.
UNBOUNDED_MAX_TOKENS = 1 << 24
#: OpenAI's limits: choices per request, and inputs per embeddings request.
MAX_CHOICES = 128
MAX_EMBEDDING_INPUTS = 2048
#: vLLM samples greedily below this temperature, and then refuses n > 1 (vllm.sampling_params).
_GREEDY_TEMPERATURE = 1e-5
#: A line's stop strings, at most: vLLM checks every one against each new token's text, in the engine's
#: output processing, which a warm replica shares with other DAGs (400,000 stops cost 45 ms a token).
#: OpenAI takes 4; vLLM's own server any number.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1024
#: Alternatives per token (``top_logprobs``, a completion's ``logprobs``), at most: OpenAI's 20, and
#: vLLM's default ``max_logprobs`` (the engine refuses more).
MAX_LOGPROBS = 20
#: Integer fields stop here: a line's 10**30 would overflow the engine row's int64 column and fail the
#: whole block. seed may use all of int64 (OpenAI's range, and vLLM's).
_MAX_INT = 2**31 - 1
_MAX_SEED = 2**63 - 1

#: Engine-row columns that carry what Ray Data LLM's engine stage leaves out (set on every row, None
#: where unused, so that the blocks' schemas agree): the inputs of an embeddings line after its first
#: (JSON list), and the choices after the first and the embeddings after the first (JSON, see
#: :func:`choice_record` and :func:`embedding_record`).
EXTRA_INPUTS = "extra_inputs"
EXTRA_CHOICES = "extra_choices"
EXTRA_EMBEDDINGS = "extra_embeddings"
#: vLLM's own finish reason of the first choice (the engine row column; see :mod:`.engine_actor`).
FINISH_REASON = "finish_reason"


class RequestError(ValueError):
    """A line that cannot be served; ``str()`` is its reason, ``'<kind>: <what and where>'``."""

    def __init__(self, kind: str, message: str, param: str | None = None) -> None:
        super().__init__(f"{kind}: {message}")
        self.param = param


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict = 2, 40, 40, 4, 4


def _show(value: JsonValue) -> str:
    """A line's value as a reason shows it: short, since a value may be megabytes or nested deeply."""
    text = _REPR.repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _line_object(line: JsonValue) -> Mapping[str, JsonValue]:
    if not isinstance(line, Mapping):
        raise RequestError(
            "not a JSON object", f"a request line must be a JSON object, got a {type(line).__name__}"
        )
    return line


def custom_id_of(line: Mapping[str, JsonValue]) -> str:
    """The line's ``custom_id``; raises RequestError when it is missing or not a non-empty string."""
    custom_id = _line_object(line).get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise RequestError("missing id", "custom_id must be a non-empty string", "custom_id")
    if len(custom_id) > MAX_ID_CHARS:  # the driver holds every id at once (read/dedupe.py)
        raise RequestError(
            "bad id", f"custom_id has {len(custom_id):,} characters, over {MAX_ID_CHARS:,}", "custom_id"
        )
    return custom_id


def parse_request(
    line: Mapping[str, JsonValue], endpoint: str, defaults: Mapping[str, JsonValue]
) -> JsonObject:
    """The engine request for one line: ``{"messages" | "prompt", "sampling_params", "meta"}``.

    :param endpoint: the batch's endpoint; a line for another url fails (OpenAI's rule too).
    :param defaults: the operator's sampling_params, under each body's own fields.
    ``meta`` carries what the response needs and the engine does not (logprobs shape, max_tokens).
    """
    custom_id_of(line)
    if line.get("method", "POST") != "POST":
        raise RequestError("unsupported method", f"method {_show(line.get('method'))}; only POST", "method")
    if line.get("url") != endpoint:
        raise RequestError(
            "unsupported url", f"url {_show(line.get('url'))}; this batch serves {endpoint}", "url"
        )
    body = line.get("body")
    if not isinstance(body, dict):
        raise RequestError("invalid request", "body must be a JSON object", "body")
    unknown = sorted(map(str, set(body) - _HONOURED_FIELDS[endpoint] - _IGNORED_FIELDS))
    if unknown:
        name = f"body.{unknown[0]}" if len(unknown[0]) <= 60 else f"body.{unknown[0][:57]}..."
        raise RequestError("unsupported parameter", f"{name} is not supported", name)
    if body.get("stream"):
        raise RequestError("unsupported parameter", "body.stream must be false in a batch", "body.stream")
    unsafe = unsafe_number(body, "body")
    if unsafe is not None:  # the fields checked below have tighter ranges; this covers every other value
        path, reason = unsafe
        raise RequestError("invalid request", reason, path)
    if endpoint == EMBEDDINGS:
        return _embedding_request(body)
    request: JsonObject = {"sampling_params": _sampling_params(body, endpoint, defaults)}
    if endpoint == CHAT:
        request["messages"] = _chat_messages(body.get("messages"))
    else:
        request["prompt"] = _completion_prompt(body)
    request["meta"] = {
        "logprobs": request["sampling_params"]["logprobs"] is not None,
        "max_tokens": request["sampling_params"]["max_tokens"],
    }
    return request


def _chat_messages(messages: JsonValue) -> list[JsonObject]:
    if not isinstance(messages, list) or not messages:
        raise RequestError("invalid request", "body.messages must be a non-empty list", "body.messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(
                "invalid request", f"body.messages[{index}] needs a role", f"body.messages[{index}]"
            )
        _check_content(message.get("content"), f"body.messages[{index}].content")
    if not any(_text_of(message["content"]).strip() for message in messages):
        raise RequestError("empty prompt", "every message of body.messages is empty", "body.messages")
    return messages


def _check_content(content: JsonValue, where: str) -> None:
    """A message's content is text, or a list of text parts (``{"type": "text", "text": "..."}``)."""
    if isinstance(content, str):
        return
    if not isinstance(content, list) or not content:
        raise RequestError(
            "invalid request", f"{where} must be text or a non-empty list of text parts", where
        )
    for number, part in enumerate(content):
        if not isinstance(part, dict):
            raise RequestError(
                "invalid request", f"{where}[{number}] must be an object, got a {type(part).__name__}", where
            )
        if part.get("type") != "text":
            raise RequestError(
                "unsupported parameter",
                f"{where}[{number}] has type {_show(part.get('type'))}: {where} may hold text parts only",
                where,
            )
        if not isinstance(part.get("text"), str):
            raise RequestError("invalid request", f"{where}[{number}].text must be a string", where)


def _text_of(content: str | list[JsonObject]) -> str:
    return content if isinstance(content, str) else "".join(str(part.get("text", "")) for part in content)


def _completion_prompt(body: Mapping[str, JsonValue]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise RequestError("invalid request", "body.prompt must be one string", "body.prompt")
    if not prompt.strip():
        raise RequestError("empty prompt", "body.prompt is empty", "body.prompt")
    if body.get("echo"):
        raise RequestError("unsupported parameter", "body.echo must be false", "body.echo")
    return prompt


def _embedding_request(body: Mapping[str, JsonValue]) -> JsonObject:
    """``prompt``: the first input; ``extra_inputs``: the others, where the line has several."""
    texts = body.get("input")
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, list) or not texts:
        raise RequestError(
            "invalid request", "body.input must be a string or a list of strings", "body.input"
        )
    if not all(isinstance(text, str) for text in texts):
        raise RequestError(
            "unsupported parameter", "body.input as token ids is not supported; send text", "body.input"
        )
    if len(texts) > MAX_EMBEDDING_INPUTS:
        raise RequestError(
            "invalid request",
            f"body.input has {len(texts)} inputs; at most {MAX_EMBEDDING_INPUTS}",
            "body.input",
        )
    for index, text in enumerate(texts):
        if not text.strip():
            where = "body.input" if len(texts) == 1 else f"body.input[{index}]"
            raise RequestError("empty prompt", f"{where} is empty", where)
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise RequestError(
            "invalid request",
            f"body.encoding_format {_show(encoding)}: use 'float' or 'base64'",
            "body.encoding_format",
        )
    request = {"prompt": texts[0], "meta": {"encoding_format": encoding}}
    if len(texts) > 1:
        request[EXTRA_INPUTS] = texts[1:]
    return request


def _number(body: Mapping[str, JsonValue], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise RequestError(
            "invalid request",
            f"body.{name}={_show(value)} must be a number in [{low}, {high}]",
            f"body.{name}",
        )
    return float(value)


def _integer(body: Mapping[str, JsonValue], name: str, low: int, high: int = _MAX_INT) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RequestError(
            "invalid request",
            f"body.{name}={_show(value)} must be an integer in [{low}, {high}]",
            f"body.{name}",
        )
    return value


def _sampling_params(body: Mapping[str, ArgValue], endpoint: str, defaults: Mapping[str, ArgValue]) -> Kwargs:
    """vLLM SamplingParams from a body. Every line gets the same keys (None where unset), so that
    the lines of one block share a schema on their way through Ray Data."""
    max_tokens = _integer(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1)
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise RequestError("invalid request", "body.stop must be a string or a list of strings", "body.stop")
    if stop is not None and (len(stop) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in stop)):
        raise RequestError(
            "invalid request",
            f"body.stop may hold at most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_CHARS:,} "
            f"characters each (it holds {len(stop):,}, the longest {max(map(len, stop)):,})",
            "body.stop",
        )
    params = {
        **defaults,
        "max_tokens": max_tokens
        if max_tokens is not None
        else defaults.get("max_tokens"),  # None: to max_model_len
        "n": _choices(body, defaults),
        "temperature": _first(_number(body, "temperature", 0, 2), defaults.get("temperature"), 1.0),
        "top_p": _first(_number(body, "top_p", 0, 1), defaults.get("top_p"), 1.0),
        "presence_penalty": _first(
            _number(body, "presence_penalty", -2, 2), defaults.get("presence_penalty"), 0.0
        ),
        "frequency_penalty": _first(
            _number(body, "frequency_penalty", -2, 2), defaults.get("frequency_penalty"), 0.0
        ),
        "stop": stop if stop is not None else defaults.get("stop"),
        "seed": _first(_integer(body, "seed", 0, _MAX_SEED), defaults.get("seed")),
        "logprobs": _logprobs(body, endpoint),
        "structured_outputs": _structured_outputs(
            body.get("response_format"), defaults.get("structured_outputs")
        ),
    }
    if params["n"] > 1 and params["temperature"] < _GREEDY_TEMPERATURE:
        raise RequestError(
            "invalid request",
            f"body.n={params['n']} needs a temperature > 0: greedy sampling has one answer",
            "body.n",
        )
    return params


def _choices(body: Mapping[str, JsonValue], defaults: Mapping[str, JsonValue]) -> int:
    """``n``, always an int (never None: vLLM's SamplingParams takes no None for it, and a block's
    int column with a null turns into floats, see NULLABLE_INT_FIELDS)."""
    n = _first(_integer(body, "n", 1), defaults.get("n"), 1)
    if n > MAX_CHOICES:
        raise RequestError("invalid request", f"body.n={n} must be at most {MAX_CHOICES}", "body.n")
    return n


def _first(*values: CellValue) -> CellValue:
    return next((value for value in values if value is not None), None)


def _logprobs(body: Mapping[str, JsonValue], endpoint: str) -> int | None:
    """vLLM's ``logprobs`` (alternatives per token, besides the chosen one) from the endpoint's fields."""
    if endpoint == COMPLETIONS:
        return _integer(body, "logprobs", 0, MAX_LOGPROBS)
    top = _integer(body, "top_logprobs", 0, MAX_LOGPROBS)
    if body.get("logprobs") in (None, False):
        if top:
            raise RequestError(
                "invalid request", "body.top_logprobs needs body.logprobs=true", "body.top_logprobs"
            )
        return None
    if body["logprobs"] is not True:
        raise RequestError("invalid request", "body.logprobs must be true or false", "body.logprobs")
    return top or 0


def _structured_outputs(
    response_format: JsonValue, default: Mapping[str, JsonValue] | None
) -> JsonObject | None:
    """vLLM structured outputs from OpenAI's ``response_format``: a JSON schema, or any JSON object.

    For compact JSON (a grammar that allows whitespace anywhere lets a weak model pad until
    max_tokens), set the engine's ``structured_outputs_config`` to ``{"backend": "xgrammar",
    "disable_any_whitespace": True}``: vLLM takes it per engine, not per request.
    """
    if response_format is None:
        return dict(default) if default else None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        return {"json": _json_schema(response_format.get("json_schema"))}
    raise RequestError(
        "unsupported parameter", f"body.response_format type {_show(kind)}", "body.response_format"
    )


#: The longest schema a line may constrain its answer to. The engine compiles each schema into a
#: grammar, in its own process (a warm replica may serve other DAGs), at about 120 us of CPU and 1.8 KB
#: of grammar a character: 300 integer-range properties (24 KB) took 2.2 s, 1,500 (120 KB) 14.4 s and
#: 697 MiB. Structured-output schemas of real requests are a few KB.
MAX_JSON_SCHEMA_CHARS = 32 * 1024


def _json_schema(json_schema: JsonValue) -> str:
    """The schema in OpenAI's ``response_format.json_schema`` (``{"name", "schema", "strict"}``), as JSON."""
    where = "body.response_format.json_schema"
    if not isinstance(json_schema, dict):
        raise RequestError("invalid request", f"{where} must be an object with a schema", where)
    schema = json_schema.get("schema")
    if not isinstance(schema, dict):
        raise RequestError("invalid request", f"{where}.schema must be an object", f"{where}.schema")
    try:
        text = json.dumps(schema)
    except RecursionError as err:  # nested as deep as the parser allowed: no encoder goes as deep
        raise RequestError(
            "invalid request", f"{where}.schema is nested too deeply", f"{where}.schema"
        ) from err
    if len(text) > MAX_JSON_SCHEMA_CHARS:
        raise RequestError(
            "invalid request",
            f"{where}.schema is {len(text):,} characters of JSON, over the {MAX_JSON_SCHEMA_CHARS:,} a "
            "schema may be",
            f"{where}.schema",
        )
    return text


def fields_to_fill(requests: Iterable[str | None]) -> frozenset[str]:
    """The NULLABLE_INT_FIELDS that some requests (JSON of :func:`parse_request`) set and others do not."""
    set_on: dict[str, set[bool]] = {name: set() for name in NULLABLE_INT_FIELDS}
    for text in requests:
        params = json.loads(text).get("sampling_params") if text else None
        if params is None:
            continue
        for name in NULLABLE_INT_FIELDS:
            set_on[name].add(params.get(name) is not None)
    return frozenset(name for name, seen in set_on.items() if seen == {True, False})


def filled_sampling_params(params: Mapping[str, ArgValue], fill: frozenset[str], source: str) -> Kwargs:
    """``params`` with each field of ``fill`` that is None set to a value that changes nothing:
    max_tokens unbounded, logprobs 0 (not shown: the response reads its own request's meta), and a
    seed of the line's own (stable across reruns) where the line asked for none."""
    filled = dict(params)
    if "max_tokens" in fill and filled.get("max_tokens") is None:
        filled["max_tokens"] = UNBOUNDED_MAX_TOKENS
    if "logprobs" in fill and filled.get("logprobs") is None:
        filled["logprobs"] = 0
    if "seed" in fill and filled.get("seed") is None:
        filled["seed"] = int(_short_hash("seed", source)[:8], 16) & 0x7FFFFFFF
    return filled


# -- output lines ------------------------------------------------------------------------------


def _short_hash(*parts: str) -> str:
    """A stable id part: a rerun writes the same ids for the same lines."""
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:24]


def _line_id(run_key: str, custom_id: str | None, source: str) -> str:
    return f"batch_req_{_short_hash(run_key, custom_id or '', source)}"


def _usage(prompt_tokens: int, completion_tokens: int | None) -> dict[str, int]:
    if completion_tokens is None:
        return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def response_line(result: Mapping[str, JsonValue], endpoint: str, model: str, run_key: str) -> JsonObject:
    """The output line of one served request.

    :param result: the engine's row: ``id`` (custom_id), ``source``, ``request`` (JSON of
        :func:`parse_request`), ``num_input_tokens``, and ``generated_text``, ``num_generated_tokens``
        and ``logprobs`` (JSON text) or ``embeddings``; and ``extra_choices`` or ``extra_embeddings``
        (JSON text, or None) for the choices or inputs after the first.
    """
    custom_id = str(result["id"])
    request_id = f"req_{_short_hash(run_key, custom_id, str(result['source']))}"
    meta = json.loads(result["request"]).get("meta", {})
    created = int(time.time())
    if endpoint == EMBEDDINGS:
        first = embedding_record(result["embeddings"], int(result["num_input_tokens"]))
        inputs = [first, *json.loads(result.get(EXTRA_EMBEDDINGS) or "[]")]
        body: JsonObject = {
            "object": "list",
            "data": [
                {"object": "embedding", "index": index, "embedding": _embedding(entry["embedding"], meta)}
                for index, entry in enumerate(inputs)
            ],
            "model": model,
            "usage": _usage(sum(entry["num_input_tokens"] for entry in inputs), None),
        }
    else:
        logprobs = json.loads(result["logprobs"]) if meta.get("logprobs") and result.get("logprobs") else None
        first = choice_record(
            result["generated_text"], int(result["num_generated_tokens"]), logprobs, result.get(FINISH_REASON)
        )
        choices = [first, *json.loads(result.get(EXTRA_CHOICES) or "[]")]
        if endpoint == CHAT:
            body = {"id": f"chatcmpl-{request_id[4:]}", "object": "chat.completion"}
        else:
            body = {"id": f"cmpl-{request_id[4:]}", "object": "text_completion"}
        body.update(
            created=created,
            model=model,
            choices=[_choice(index, choice, endpoint, meta) for index, choice in enumerate(choices)],
            usage=_usage(
                int(result["num_input_tokens"]), sum(choice["num_generated_tokens"] for choice in choices)
            ),
        )
    return {
        "id": _line_id(run_key, custom_id, str(result["source"])),
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": request_id, "body": body},
        "error": None,
    }


def choice_record(
    text: str,
    num_generated_tokens: int,
    logprobs: list[JsonObject] | None,
    finish_reason: str | None = None,
) -> JsonObject:
    """One choice as the engine row carries it: ``logprobs`` as :func:`token_logprobs` gives them;
    ``finish_reason`` as vLLM gave it (None: not known)."""
    return {
        "text": text,
        "num_generated_tokens": num_generated_tokens,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
    }


def embedding_record(vector: Sequence[float], num_input_tokens: int) -> JsonObject:
    """One input's embedding as the engine row carries it."""
    return {"embedding": [float(value) for value in vector], "num_input_tokens": num_input_tokens}


#: vLLM's finish reasons that OpenAI has too ("stop": an end-of-sequence token or a stop string).
_OPENAI_FINISH_REASONS = ("stop", "length")


def _choice(
    index: int, choice: Mapping[str, JsonValue], endpoint: str, meta: Mapping[str, JsonValue]
) -> JsonObject:
    finish_reason = choice.get("finish_reason")
    if finish_reason not in _OPENAI_FINISH_REASONS:  # not known: inferred from the token count
        tokens, max_tokens = choice["num_generated_tokens"], meta.get("max_tokens")
        finish_reason = "length" if max_tokens is not None and tokens >= max_tokens else "stop"
    # Logprobs the line did not ask for may be there (filled in: see filled_sampling_params).
    logprobs = choice["logprobs"] if meta.get("logprobs") else None
    if endpoint == CHAT:
        return {
            "index": index,
            "finish_reason": finish_reason,
            "message": {"role": "assistant", "content": choice["text"]},
            "logprobs": _chat_logprobs(logprobs) if logprobs is not None else None,
        }
    return {
        "index": index,
        "finish_reason": finish_reason,
        "text": choice["text"],
        "logprobs": _completion_logprobs(logprobs) if logprobs is not None else None,
    }


def error_line(custom_id: str | None, source: str, reason: str, run_key: str) -> JsonObject:
    """The error-file line of a request that failed: ``error.code`` from the reason's kind, and the
    input line (``source``, ``<file>:<line>``) in the message so a line without custom_id is found too."""
    kind = reason.split(":", 1)[0].strip()
    return {
        "id": _line_id(run_key, custom_id, source),
        "custom_id": custom_id,
        "response": None,
        "error": {"code": _ERROR_CODES.get(kind, "invalid_request"), "message": f"{reason} (line {source})"},
    }


def error_reason(line: Mapping[str, JsonValue]) -> str:
    """The reason an error line carries, without the line reference :func:`error_line` appends."""
    return str(line["error"]["message"]).rsplit(" (line ", 1)[0]


def token_counts(line: Mapping[str, JsonValue]) -> tuple[int, int]:
    """(prompt tokens, completion tokens over all its choices) of an output line."""
    usage = line["response"]["body"]["usage"]
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


def _embedding(vector: list[float], meta: Mapping[str, JsonValue]) -> list[float] | str:
    if meta.get("encoding_format") == "base64":  # OpenAI's: little-endian float32, base64
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return vector


def token_logprobs(
    # Keys: token ids (int, or text after a trip through Arrow).
    logprobs: Sequence[Mapping[CellValue, Mapping[str, JsonValue]]],
    generated_tokens: Sequence[int],
) -> list[JsonObject]:
    """vLLM's per-token logprobs (token id -> {logprob, rank, decoded_token}) as one entry per
    generated token: ``{"token", "logprob", "top": [{"token", "logprob"}, ...]}``, alternatives by rank."""
    steps = []
    for step, chosen_id in zip(logprobs, generated_tokens, strict=False):
        entries = {str(token_id): entry for token_id, entry in step.items()}
        ranked = sorted(entries.values(), key=lambda entry: int(entry.get("rank") or 0))
        chosen = entries.get(str(chosen_id)) or ranked[0]
        steps.append(
            {
                "token": str(chosen.get("decoded_token") or ""),
                "logprob": float(chosen["logprob"]),
                "top": [
                    {"token": str(e.get("decoded_token") or ""), "logprob": float(e["logprob"])}
                    for e in ranked
                ],
            }
        )
    return steps


def _chat_logprobs(steps: Sequence[Mapping[str, JsonValue]]) -> JsonObject:
    def entry(token: str, logprob: float) -> JsonObject:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    return {
        "content": [
            {
                **entry(step["token"], step["logprob"]),
                "top_logprobs": [entry(t["token"], t["logprob"]) for t in step["top"]],
            }
            for step in steps
        ]
    }


def _completion_logprobs(steps: Sequence[Mapping[str, JsonValue]]) -> JsonObject:
    offsets, offset = [], 0
    for step in steps:
        offsets.append(offset)
        offset += len(step["token"])
    return {
        "tokens": [step["token"] for step in steps],
        "token_logprobs": [step["logprob"] for step in steps],
        "top_logprobs": [{t["token"]: t["logprob"] for t in step["top"]} for step in steps],
        "text_offset": offsets,
    }
