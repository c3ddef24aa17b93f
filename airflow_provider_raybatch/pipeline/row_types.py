"""The row at each stage of the pipeline, as typed dicts: what each step takes and hands on.

A row goes: an input record (:mod:`.read.rows`) -> a :class:`PreparedRow`
(:func:`.row_steps.prepare_row`: its prompt or OpenAI request, or its reason to fail) -> an
:data:`EngineRequest` (:func:`.row_steps.engine_request`: what Ray Data LLM's stages take) -> an
:class:`EngineRow` as it leaves the engine stage (the prepared columns, passed through, with the
engine's; :class:`EngineOutput` its generated columns) -> a :class:`StagedRow`
(:func:`.row_steps.stage_engine_rows`, :meth:`.stage.parts.PartWriter.write_part`: the output row or
the error row, as JSON text).

A leaf: it imports nothing of the package but its JSON names, so every stage (the prompt stages, the
engine replicas, the parts) can import it without the others.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from airflow_provider_raybatch.shared.json_types import CellValue


class PreparedRow(TypedDict):
    """An input row prepared for the engine, or failed with its reason; every column text or null, so
    that Ray's blocks stay uniform."""

    id: str  #: the row's id (its id column's, an OpenAI line's custom_id), else its source
    source: str  #: ``<file>:<line or row number>``
    row: str | None  #: the input row as JSON (images described, never their bytes)
    messages: str | None  #: the chat messages as JSON, or
    prompt: str | None  #: the prompt text
    sampling: str | None  #: the sampling parameters as JSON
    request: str | None  #: an OpenAI batch line's engine request as JSON
    error: str | None  #: why the row fails before the engine; None for a row the engine takes


#: What Ray Data LLM's stages take (:func:`.row_steps.engine_request`): the prompt and sampling
#: parameters as JSON text, and the engine stage's extra columns, None where unused, so that the blocks'
#: schemas agree. A row failed here carries its reason in the error column; an OpenAI line has none.
EngineRequest = TypedDict(
    "EngineRequest",
    {
        "extra_inputs": str | None,
        "extra_choices": str | None,
        "extra_embeddings": str | None,
        "finish_reason": str | None,
        "__inference_error__": NotRequired[str],
        "messages": NotRequired[str | None],
        "prompt": NotRequired[str | None],
        "sampling_params": NotRequired[str | None],
        # with images: {"image": [PIL images]}, decoded for this hop only
        "multimodal_data": NotRequired[dict[str, CellValue] | None],
    },
)


class EngineRow(PreparedRow, total=False):
    """A row as it leaves the engine stage: the prepared columns, passed through, and the engine's.

    A row that failed in the engine (or before it) has a reason in
    :data:`.row_marks.INFERENCE_ERROR` and may lack the generated columns.
    """

    __inference_error__: str  # :data:`.row_marks.INFERENCE_ERROR`
    generated_text: str
    num_input_tokens: int
    num_generated_tokens: int
    generated_tokens: list[int]
    logprobs: CellValue  # vLLM's per-token logprobs, as the engine stage returns them
    embeddings: CellValue  # an embedding model's vector (a list or an array of floats)
    extra_choices: str | None
    extra_embeddings: str | None
    finish_reason: str | None


class EngineOutput(TypedDict):
    """The generated columns of a good row, taken from its :class:`EngineRow` for the staged result."""

    id: str
    source: str
    row: str | None
    request: str | None
    sampling: str | None
    generated_text: str
    num_input_tokens: int
    num_generated_tokens: int
    # An OpenAI line's: what its response line may carry besides the text.
    logprobs: NotRequired[str | None]
    embeddings: NotRequired[list[float] | None]
    extra_choices: NotRequired[str | None]
    extra_embeddings: NotRequired[str | None]
    finish_reason: NotRequired[str | None]


class StagedRow(TypedDict):
    """A row's result, as a part stages it: its output row (``ok``) or its error row, as JSON text."""

    source: str
    ok: bool
    record: str
    #: A good row's engine token counts (input, generated), whatever its postprocess returns.
    tokens: NotRequired[list[int]]
    #: A good row's answer when it is constrained to a choice (counted per label), else None.
    label: NotRequired[str | None]
