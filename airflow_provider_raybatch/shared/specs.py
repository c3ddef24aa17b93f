"""The batch job spec: one pydantic model shared by the operator and the pipeline on the cluster.

The operator builds a :class:`BatchInferenceSpec` after templating and ships ``model_dump_json()``;
the pipeline rebuilds it with ``model_validate_json``. Both sides run the same rules, so nothing is
checked twice by hand. Imports: pydantic and the standard library only (the cluster side has no
Airflow, the Airflow side has no Ray).
"""

from __future__ import annotations

import difflib
import hashlib
import ipaddress
import json
import re
import typing
from collections.abc import Iterable
from types import UnionType
from typing import Annotated, Any, Literal, NamedTuple, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from airflow_provider_raybatch.shared.exceptions import BatchSpecError
from airflow_provider_raybatch.shared.json_schema import schema_problem
from airflow_provider_raybatch.shared.json_types import ArgValue, JsonValue, Kwargs

InputFormat = Literal["jsonl", "csv", "parquet"]
OutputFormat = Literal["parquet", "jsonl"]
#: The OpenAI Batch API endpoints a batch file may target (shared/openai_endpoints.py).
OpenAIEndpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]

#: Columns the pipeline adds to every output row; input columns may not be kept under these names.
GENERATED_COLUMNS = ("generated_text", "num_input_tokens", "num_generated_tokens")
#: Column of the errors output that says why a row failed.
ERROR_COLUMN = "error"
#: The share of failed rows above which a run fails its task unless the DAG says otherwise: a careful
#: default, since a prompt or data change that breaks one row in ten is worth a look before the
#: next task reads the output.
DEFAULT_MAX_FAILED_FRACTION = 0.1
#: The longest keep-warm window (a day): engines held longer belong in a serving deployment.
KEEP_WARM_SECONDS_LIMIT = 86_400
#: The most pixels an image part may hold (``pipeline/read/images.py`` PART_MAX_PIXELS; images are not
#: imported here, the operator's side has no Pillow).
MAX_IMAGE_PIXELS = 64 * 1024 * 1024
#: Column added when the input has no id column: ``<file name>:<row number>``.
DERIVED_ID_COLUMN = "row_id"
#: Where each node keeps fetched s3:// models: the Ray user's own home (expanded by the job's driver), not a
#: shared folder like /tmp, where another local user who made ``/tmp/raybatch`` first would own it
#: and the owner check would refuse every job's cache.
DEFAULT_MODEL_CACHE_DIR = "~/.cache/raybatch/models"

_SUFFIX_FORMATS: dict[str, InputFormat] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
_SUPPORTED_SCHEMES = ("", "file", "s3")
# SamplingParams fields of vLLM (0.25 - 0.32) that make sense per batch; the private ones and the
# engine-internal ones (output_kind, skip_clone, ...) are left out on purpose.
VLLM_SAMPLING_PARAMS = frozenset(
    """
    n presence_penalty frequency_penalty repetition_penalty temperature top_p top_k min_p seed stop
    stop_token_ids bad_words ignore_eos max_tokens min_tokens logprobs prompt_logprobs detokenize
    skip_special_tokens spaces_between_special_tokens include_stop_str_in_output logit_bias allowed_token_ids
    extra_args structured_outputs thinking_token_budget
    """.split()
)
STRUCTURED_OUTPUT_KINDS = frozenset({"json", "regex", "choice", "grammar", "json_object", "structural_tag"})
STRUCTURED_OUTPUT_OPTIONS = frozenset(
    {"disable_any_whitespace", "disable_additional_properties", "whitespace_pattern"}
)
_DOTTED_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*([:.][A-Za-z_]\w*)$")
# A host name as a URL carries it: dot-separated labels of letters, digits, '-' and '_' (internal names).
_HOST_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9_](?:[a-z0-9_-]{0,62})(?:\.[a-z0-9_](?:[a-z0-9_-]{0,62}))*$")

ColumnName = Annotated[str, Field(min_length=1)]


#: A user_template that is a template file's path, not a template: no space, a template's suffix.
_TEMPLATE_FILE = re.compile(r"[\w./~-]+\.(txt|j2|jinja2?|tmpl|tpl|prompt|md)", re.IGNORECASE)
#: Suffixes of compressed files, which nothing here decompresses (Parquet compresses inside its files).
_COMPRESSED_SUFFIXES = (".gz", ".gzip", ".bz2", ".xz", ".zst", ".zstd", ".lz4", ".zip", ".snappy")


def refuse_template_path(template: str) -> None:
    """Check ``user_template``'s fields, and refuse one that is a template file's path: every row's
    prompt would be the path (Airflow renders a file only for a field in ``template_ext``, and the
    operator has none)."""
    if not template_fields(template) and _TEMPLATE_FILE.fullmatch(template.strip()):
        raise ValueError(
            f"user_template={template!r} reads as a file's path, and the template is the text itself: "
            "every row's prompt would be that path (Airflow renders a file only for a field with "
            "template_ext, and this operator has none). Read the file in the DAG "
            "(user_template=Path(__file__).with_name('prompt.txt').read_text()) or in a preprocess."
        )


def refuse_compressed_input(uri: str) -> None:
    """A file named alone whose suffix is a compression's: read as jsonl or csv it would be its raw
    bytes (every row a parse error), so it is refused with what to do."""
    path = uri.split("?", 1)[0].rstrip("/").lower()
    compressed = next((suffix for suffix in _COMPRESSED_SUFFIXES if path.endswith(suffix)), None)
    if compressed is not None:
        raise BatchSpecError(
            f"input_uri={uri!r} names a compressed file ({compressed}): nothing is decompressed, and "
            "read as jsonl or csv it would be its raw bytes. Decompress it first (in an upstream task), "
            "or write Parquet, which compresses inside its files."
        )


def infer_input_format(uri: str) -> InputFormat:
    """The input format named by a URI's suffix, e.g. ``.csv`` -> ``csv``."""
    path = uri.split("?", 1)[0].rstrip("/")
    for suffix, fmt in _SUFFIX_FORMATS.items():
        if path.lower().endswith(suffix):
            return fmt
    raise BatchSpecError(
        f"input_format cannot be inferred from input_uri={uri!r}: its suffix is none of "
        f"{sorted(_SUFFIX_FORMATS)}. Pass input_format='jsonl', 'csv' or 'parquet'."
    )


# One row field of user_template: {Column}, {Column!r}, {Column:>10}, str.format's field syntax, but
# only where a brace opens one. Its name, conversion and format spec hold no brace, quote or line
# break, so a JSON example ({"label": ...}, keys quoted) or {} is never a field. See TemplateField.
_TEMPLATE_FIELD = re.compile(
    r"\{(?P<name>[^{}:!\"'\r\n]+)(?:!(?P<conversion>[^{}:\"'\r\n]*))?(?::(?P<format_spec>[^{}\"'\r\n]*))?\}"
)


class TemplateField(NamedTuple):
    """One ``{Column}`` of ``user_template``: the column, its ``!r``/``!s``/``!a`` and format spec, and
    its text as written (for error messages)."""

    name: str
    conversion: str | None
    format_spec: str
    text: str


def parse_user_template(template: str) -> list[str | TemplateField]:
    """``user_template`` (as Airflow rendered it) as literal text and row fields, in order.

    The one templating rule, in two steps, so that a prompt can hold any literal brace:

    1. Airflow renders the field with Jinja, as every templated field: ``{{ ds }}``, ``{{ params.x }}``.
       Jinja reads only ``{{``, ``{%`` and ``{#``, none of which occur in JSON outside its strings.
    2. For each row, ``{Column}`` (with an optional ``!r``/``!s``/``!a`` and ``:format_spec``, as in
       ``str.format``) is that row's value. A field's name, conversion and format spec hold no brace,
       quote or line break, and the name is not blank. Every other brace is literal text, so a JSON
       example such as ``{"label": "..."}`` (its keys are quoted), ``{}`` or ``}}`` is sent as written.

    Doubling (``{{``/``}}``) is not an escape here: Jinja owns ``{{``, so ``str.format``'s escape
    could only be reached through ``{% raw %}``, and ``}}`` closes nested JSON objects. A literal
    ``{Word}`` that reads as a field is built in a preprocess function instead. Documented, with why
    this rule, in docs/howto-daily-run.md ("user_template: Jinja, then {Column}"). Raises
    BatchSpecError for a field the pipeline cannot fill: a positional ``{0}``, attribute or index
    access ``{a.b}``, or an unknown conversion.
    """
    pieces: list[str | TemplateField] = []
    literal_start = position = 0
    while (position := template.find("{", position)) != -1:
        match = _TEMPLATE_FIELD.match(template, position)
        if match is None or not match["name"].strip():
            position += 1  # a literal brace
            continue
        field = TemplateField(match["name"], match["conversion"], match["format_spec"] or "", match[0])
        _check_template_field(template, field)
        if position > literal_start:
            pieces.append(template[literal_start:position])
        pieces.append(field)
        literal_start = position = match.end()
    if literal_start < len(template):
        pieces.append(template[literal_start:])
    return pieces


def _check_template_field(template: str, field: TemplateField) -> None:
    if field.conversion is not None and field.conversion not in ("r", "s", "a"):
        raise BatchSpecError(
            f"user_template={_shorten(template)!r} field {field.text} has an unknown conversion; "
            "use !r, !s or !a, or none."
        )
    if field.name.strip().isdigit():
        raise BatchSpecError(
            f"user_template={_shorten(template)!r} has a positional field {field.text}; "
            "name a column instead, e.g. {Company}."
        )
    if any(c in field.name for c in ".[]"):
        raise BatchSpecError(
            f"user_template={_shorten(template)!r} field {field.text} uses attribute or index access; "
            "refer to whole columns only, or build the text in a preprocess function."
        )


def _shorten(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def template_fields(template: str) -> list[str]:
    """Column names a user template refers to, in order (:func:`parse_user_template`)."""
    return [piece.name for piece in parse_user_template(template) if isinstance(piece, TemplateField)]


class BatchInferenceSpec(BaseModel):
    """Everything the pipeline needs to run one batch; the field descriptions are the documentation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1, description="Hugging Face id or path of the model the cluster loads.")
    input_uri: str = Field(min_length=1, description="File or folder the job reads: a local path or s3://.")
    output_uri: str = Field(
        min_length=1, description="Folder the job writes outputs, errors and manifest to."
    )
    input_format: InputFormat | None = Field(
        default=None, description="jsonl, csv or parquet; inferred from input_uri's suffix when unset."
    )
    output_format: OutputFormat = Field(
        default="parquet", description="Format of outputs and errors (jsonl with openai_endpoint)."
    )
    openai_endpoint: OpenAIEndpoint | None = Field(
        default=None,
        description="Read an OpenAI batch file (JSONL lines with custom_id, method, url and body) for this "
        "endpoint and write OpenAI's batch output format, joined to the input by custom_id; each line's "
        "body sets its own sampling parameters over sampling_params. A line for another url, or with a "
        "field this pipeline cannot honour, fails alone. Replaces user_template/messages_column.",
    )
    messages_column: ColumnName | None = Field(
        default=None, description="Column holding OpenAI-style chat messages, passed through as they are."
    )
    system_prompt: str | None = Field(default=None, description="System message put before the user message.")
    user_template: str | None = Field(
        default=None,
        description='User message for each row, e.g. \'Sector of {Company}? Answer as {"label": "..."}\'. '
        "Airflow renders it with Jinja first ({{ data_interval_start | ds }}); then each {Column} "
        "(optionally {Column!r} or {Column:.2f}, as in str.format) is that row's value. Every other "
        "brace is literal text, so JSON examples are written as they are; there is no doubled-brace "
        "escape (parse_user_template).",
    )
    image_column: ColumnName | None = Field(
        default=None,
        description="Column holding each row's image, for a vision-language model: a Hugging Face image "
        "struct {'bytes': ..., 'path': ...} (image datasets in Parquet), bytes, a data: URL, a local path "
        "(relative paths are read from the input file's folder), a file:// or s3:// URI, or an http(s) URL. "
        "The user message is the image followed by user_template's text. A row whose image is missing or "
        "cannot be read, decoded or checked becomes an error row with the reason. The image is never "
        "copied to the outputs, and error rows show a short description of it instead of its bytes. "
        "Needs user_template. engine_kwargs['limit_mm_per_prompt'] defaults to {'image': 1} then.",
    )
    image_size: tuple[PositiveInt, PositiveInt] | None = Field(
        default=None,
        description="Resize every image to exactly (width, height) pixels, e.g. (448, 448), so each costs "
        "the same number of vision tokens; unset: the size is kept (see image_max_side). Needs image_column.",
    )
    image_max_side: PositiveInt | None = Field(
        default=None,
        description="Shrink (never enlarge) every image so its longer side is at most this many pixels, "
        "keeping the aspect ratio; exclusive with image_size. Needs image_column.",
    )
    image_allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts whose http(s):// images may be fetched although they are not on the public "
        "internet: host names, matched exactly (e.g. 'images.internal'), IP addresses ('10.1.2.3') or CIDR "
        "blocks ('10.0.0.0/8'), each optionally with a port ('images.internal:8080', '[fd00::5]:443'). "
        "Prefer host:port: an entry without a port allows every port on that host, so rows could reach "
        "(and tell apart) the other services there, such as the Ray dashboard. Unset, an image URL whose "
        "host is or resolves to a loopback, private "
        "(10/8, 172.16/12, 192.168/16, fc00::/7), link-local (169.254/16, where cloud metadata services "
        "answer; fe80::/10), shared, multicast, unspecified or reserved address fails its row with "
        "'image source not allowed', before any connection is made. The check is on the address the fetch "
        "connects to, and again for every redirect; proxies from the environment (HTTP(S)_PROXY) are not "
        "used. Applies to image_column and to images in messages.",
    )
    image_allowed_local_path: str | None = Field(
        default=None,
        description="An absolute folder on the cluster's nodes that images given as local paths or file:// "
        "URIs may also be read from; unset: only the input folder (input_uri's folder, or input_uri itself "
        "when it is a folder, when it is local). A path is judged after its symlinks and '..' steps are "
        "resolved; one outside fails its row with 'image source not allowed'. Like vLLM's "
        "allowed_local_media_path.",
    )
    image_allowed_s3_prefixes: list[str] = Field(
        default_factory=list,
        description="s3:// folders that images may also be read from with the job's S3 credentials, e.g. "
        "['s3://media-bucket/photos']; unset: only the input's own folder when input_uri is on S3. A key "
        "outside them, or with a '.' or '..' step, fails its row with 'image source not allowed'.",
    )
    preprocess: str | None = Field(
        default=None,
        description="Dotted path of a row -> row function applied before the prompt is built. With "
        "image_column, the image column's bytes reach it as a 'data:application/octet-stream;base64,' URL.",
    )
    postprocess: str | None = Field(
        default=None, description="Dotted path of a row -> row function applied to each output row."
    )
    sampling_params: Kwargs = Field(
        default_factory=dict,
        description="vLLM SamplingParams, e.g. max_tokens, structured_outputs={'json': a JSON schema}. "
        "Unknown keys are refused with the likely one; a JSON schema's misspelled keyword "
        "('requried'), non-JSON type ('str') or required name one letter off a property is refused "
        "too, since JSON Schema would ignore it and the output not be held to it.",
    )
    engine_kwargs: Kwargs = Field(
        default_factory=dict,
        description="vLLM engine arguments, e.g. max_model_len. gpu_memory_utilization, "
        "kv_cache_memory_bytes or num_gpu_blocks_override make the layout the job's own (see concurrency).",
    )
    batch_size: PositiveInt = Field(default=64, description="Rows per batch sent to one engine replica.")
    concurrency: PositiveInt | tuple[PositiveInt, PositiveInt] | None = Field(
        default=None,
        description="Engine replicas: an int n, n replicas all started at once; or (min, max) for an "
        "autoscaling pool. Unset: chosen as the job starts (pipeline/generate/default_layout.py): up to 3 "
        "replicas sharing one GPU for short generations (a choice, or max_tokens <= 32), else one.",
    )
    max_concurrent_batches: PositiveInt | None = Field(
        default=None,
        description="Batches one replica works on at once (Ray Data LLM's default when unset). Also "
        "bounds the rows a killed run was generating: up to max_concurrent_batches x batch_size per replica.",
    )
    accelerator_type: str | None = Field(default=None, description="Ray accelerator type, e.g. 'H100'.")
    replica_resources: dict[str, float] | None = Field(
        default=None,
        description="Resources one engine replica reserves, e.g. {'CPU': 1} for vLLM's CPU build; "
        "unset: Ray Data LLM's default of one GPU per tensor x pipeline parallel rank, or a share of "
        "one GPU where the default layout runs several replicas on it (see concurrency).",
    )
    id_column: ColumnName | None = Field(
        default=None,
        description=f"Column that identifies a row; unset: '{DERIVED_ID_COLUMN}' = <file>:<row number>.",
    )
    keep_columns: list[ColumnName] | None = Field(
        default=None,
        description="Input columns copied to the output; unset: all of them. Also what postprocess "
        "receives of the input: keep a column postprocess reads. An image_column cannot be kept.",
    )
    model_cache_dir: str = Field(
        default=DEFAULT_MODEL_CACHE_DIR,
        description="Folder on each node that keeps a fetched s3:// model between runs (used when the "
        "job ships its own S3 settings; see pipeline/generate/model_cache.py); ~ is the Ray user's home "
        "as the job's driver sees it, which must be the same path on every node. It must be the Ray "
        "user's and writable by nobody else (made 0700 when missing), and so must every folder below it; "
        "the folders above it must be the Ray user's or root's.",
    )
    compile_cache_dir: str | None = Field(
        default=None,
        description="Folder on each GPU node where the replicas keep vLLM's torch.compile cache, "
        "Triton's kernels and torch Inductor's code between runs (a persistent volume makes a fresh "
        "node's first run warm); unset: the nodes' own VLLM_CACHE_ROOT (default ~/.cache/vllm) and "
        "TRITON_CACHE_DIR (default ~/.triton/cache), Inductor's under vLLM's. vLLM, Triton and torch run "
        "what it holds: it and its triton and inductor folders must be the Ray user's and writable by "
        "nobody else (made 0700 when missing; 0700 or 0755 is fine), and the folders above it the Ray "
        "user's or root's; otherwise the job fails naming the folder. So must the nodes' folders where "
        "it is unset. engine_kwargs' compilation_config cannot set a cache_dir of its own.",
    )
    keep_warm_seconds: NonNegativeFloat | None = Field(
        default=None,
        le=KEEP_WARM_SECONDS_LIMIT,
        description="Run on a warm engine pool: the job uses the engine replicas an earlier job with the "
        "same model and engine settings left running, or starts them, and they stay this many seconds "
        "after the last job leaves them, then free their GPUs. Jobs of a backfill then pay the engine "
        "start-up once. Unset: the job starts its own engines and stops them at its end. One-GPU (or "
        "one-CPU) engines only: not with tensor or pipeline parallel engine_kwargs.",
    )
    run_key: str = Field(
        default="manual",
        pattern=r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$",  # a folder name: never '.' or '..'
        description="Identity of the logical run (the operator derives it from dag, run, task and map "
        "index): retries of one run share its staging folder and resume from it.",
    )
    max_failed_fraction: float = Field(
        default=DEFAULT_MAX_FAILED_FRACTION,
        ge=0,
        le=1,
        description="Fail the task when more than this share of the distinct rows failed: error rows less "
        "duplicate ids over rows in less duplicate ids (an id counts once: its repeats, and its rows that "
        "failed when another of its rows has the answer, are neither failures nor rows of their own). Such "
        "a run is held, not committed: what was current stays so, and its outputs and errors are kept for "
        "a look; the task fails with the counts and the most common reasons. A run whose every row failed "
        "always fails. 1.0: never fail for failed rows (except all of them).",
    )
    max_failed_rows: NonNegativeInt | None = Field(
        default=None,
        description="Also fail the task when more than this many rows failed (not counting duplicate ids); "
        "unset: only max_failed_fraction applies.",
    )
    keep_versions: bool = Field(
        default=False,
        description="Keep earlier committed versions under output_uri/versions/ instead of deleting "
        "them once a rerun of the same output commits.",
    )
    dry_run: bool = Field(
        default=False,
        description="Run everything but the engine: read, validate and dedupe every row, render and "
        "tokenize every prompt, and write a manifest and report under output_uri/_dry_runs/<run_key>/ "
        "(rows, predicted failures by reason, duplicates, prompt tokens and their histogram, an "
        "estimate of GPU time). Commits nothing, starts no engine and needs no GPU.",
    )
    dry_run_rows_per_second: PositiveFloat | None = Field(
        default=None,
        description="The throughput a dry run estimates GPU time with; unset: the rows per second "
        "of the last run committed at output_uri, if any.",
    )

    @field_validator("input_format", "output_format", mode="before")
    @classmethod
    def _lower_case_format(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value  # "JSONL", as file suffixes match

    @field_validator("input_uri", "output_uri")
    @classmethod
    def _check_uri(cls, value: str, info: ValidationInfo) -> str:
        scheme, found, rest = value.partition("://")
        scheme = scheme.lower() if found else ""
        if scheme not in _SUPPORTED_SCHEMES:
            raise ValueError(
                f"{info.field_name}={value!r} uses scheme {scheme!r}; use a local path or s3://bucket/key."
            )
        # As every reader compares it: "FILE://" went to readers that follow links, and "S3://" to
        # pyarrow's own S3 settings rather than the job's.
        return f"{scheme}://{rest}" if found else value

    @field_validator("model")
    @classmethod
    def _check_model_scheme(cls, value: str, info: ValidationInfo) -> str:
        # "S3://bucket/model" passed every "s3://" check (the job's S3 settings, its private, checked
        # model cache) while vLLM, which ignores the case, fetched it with the node's own settings;
        # and vLLM fetches gs:// and az:// itself, with the node's settings, into no cache of ours.
        scheme, found, rest = value.partition("://")
        if not found:
            return value
        if scheme.lower() != "s3":
            raise ValueError(
                f"{info.field_name}={value!r} uses scheme {scheme.lower()!r}; use a Hugging Face id, "
                "a local folder or s3://bucket/prefix."
            )
        return f"s3://{rest}"

    @field_validator("preprocess", "postprocess")
    @classmethod
    def _check_dotted_path(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not _DOTTED_PATH.match(value):
            raise ValueError(
                f"{info.field_name}={value!r} is not a dotted path; use 'my_module.my_function' "
                "or 'my_package.my_module:my_function'."
            )
        return value

    @field_validator("image_allowed_hosts")
    @classmethod
    def _check_image_allowed_hosts(cls, value: list[str]) -> list[str]:
        for index, entry in enumerate(value):
            parse_allowed_host_entry(entry, f"image_allowed_hosts[{index}]")
        return value

    @field_validator("image_allowed_local_path")
    @classmethod
    def _check_image_allowed_local_path(cls, value: str | None) -> str | None:
        if value is not None:
            check_allowed_local_path(value)
        return value

    @field_validator("image_allowed_s3_prefixes")
    @classmethod
    def _check_image_allowed_s3_prefixes(cls, value: list[str]) -> list[str]:
        for index, prefix in enumerate(value):
            parse_s3_prefix(prefix, f"image_allowed_s3_prefixes[{index}]")
        return value

    @field_validator("sampling_params")
    @classmethod
    def _check_sampling_params(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_sampling_params(value)
        return value

    @field_validator("engine_kwargs")
    @classmethod
    def _check_engine_kwargs(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in ("tensor_parallel_size", "pipeline_parallel_size", "max_model_len", "max_num_seqs"):
            if key in value and (not isinstance(value[key], int) or value[key] < 1):
                raise ValueError(f"engine_kwargs['{key}']={value[key]!r} must be an int >= 1.")
        if "model" in value:
            raise ValueError("engine_kwargs['model'] is not allowed; pass the model as model=....")
        compilation = value.get("compilation_config")
        if isinstance(compilation, dict) and compilation.get("cache_dir"):
            # vLLM loads and runs the compiled graphs it finds there; the replica checks only the cache
            # folders it names itself (pipeline/generate/engine_caches.py).
            raise ValueError(
                f"engine_kwargs['compilation_config']['cache_dir']={compilation['cache_dir']!r} is not "
                "allowed: vLLM runs the compiled code it finds there, and only compile_cache_dir is checked "
                "to be a folder of the Ray user's alone. Set compile_cache_dir instead."
            )
        _check_json_serializable("engine_kwargs", value)
        _check_no_remote_sources("engine_kwargs", value)
        return value

    @field_validator("concurrency")
    @classmethod
    def _check_concurrency(cls, value: int | tuple[int, int] | None) -> int | tuple[int, int] | None:
        if isinstance(value, tuple) and value[0] > value[1]:
            raise ValueError(
                f"concurrency={value!r} is invalid: min must be <= max. "
                "Pass an int or a (min, max) tuple with 1 <= min <= max."
            )
        return value

    @field_validator("model_cache_dir", "compile_cache_dir")
    @classmethod
    def _check_cache_dir(cls, value: str | None, info: ValidationInfo) -> str | None:
        # The replica checks the folders as the path names them; the kernel resolves a '..' after the
        # links before it: '/tmp/x/../cache' with x another user's link is their folder, checked as ours.
        if value is None:
            return value
        if not (value.startswith(("/", "~/")) and ".." not in value.split("/")):
            raise ValueError(
                f"{info.field_name}={value!r} must be an absolute path (or start with '~/') with no '..' "
                "step: vLLM runs what that folder holds, and it is checked as its path names it."
            )
        return value

    @field_validator("replica_resources")
    @classmethod
    def _check_replica_resources(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is not None and (not value or any(amount <= 0 for amount in value.values())):
            raise ValueError(
                f"replica_resources={value!r} must map resource names to amounts > 0, e.g. {{'CPU': 1}}."
            )
        return value

    @model_validator(mode="after")
    def _check_keep_warm(self) -> BatchInferenceSpec:
        parallel = {
            name: self.engine_kwargs.get(name) for name in ("tensor_parallel_size", "pipeline_parallel_size")
        }
        parallel = {name: value for name, value in parallel.items() if value not in (None, 1)}
        if self.keep_warm_seconds is not None and parallel:
            raise ValueError(
                f"keep_warm_seconds={self.keep_warm_seconds:g} with engine_kwargs {parallel}: a warm pool "
                "holds one-GPU engines only; drop keep_warm_seconds for a tensor or pipeline parallel engine."
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _openai_defaults(cls, values: JsonValue) -> JsonValue:
        """An OpenAI batch file is JSONL in and JSONL out, whatever its name says."""
        if isinstance(values, dict) and values.get("openai_endpoint"):
            values = {**values}
            for name in ("input_format", "output_format"):
                values[name] = values.get(name) or "jsonl"
        return values

    @model_validator(mode="after")
    def _check_prompt_and_columns(self) -> BatchInferenceSpec:
        if self.openai_endpoint is not None:
            self._check_openai_fields()
        elif self.messages_column is not None and self.user_template is not None:
            raise ValueError(
                "messages_column and user_template are exclusive: pass messages_column='messages' for rows "
                "that carry chat messages, or user_template='... {Column} ...'."
            )
        elif self.messages_column is None and self.user_template is None and self.preprocess is None:
            raise ValueError(
                "no prompt: pass user_template='... {Column} ...', messages_column='messages' for rows that "
                "carry chat messages, or a preprocess that returns 'messages' or 'prompt' "
                "(as in Ray Data LLM)."
            )
        else:
            check_sampling_params(self.sampling_params, one_text_per_row=True)
        if self.system_prompt is not None and self.user_template is None:
            raise ValueError("system_prompt is only used with user_template; put it in the messages instead.")
        if self.user_template is not None:
            refuse_template_path(self.user_template)
        reserved = {*GENERATED_COLUMNS, ERROR_COLUMN}
        clashes = sorted(reserved & set(self.keep_columns or []))
        if clashes:
            raise ValueError(f"keep_columns={self.keep_columns!r} names output columns {clashes}; drop them.")
        if self.id_column in reserved:
            raise ValueError(f"id_column={self.id_column!r} is an output column name; pick another column.")
        self._check_image_fields()
        refuse_compressed_input(self.input_uri)
        if self.input_format is None:
            infer_input_format(self.input_uri)
        if self.input_uri.rstrip("/") == self.output_uri.rstrip("/"):
            raise ValueError(f"output_uri={self.output_uri!r} must differ from input_uri.")
        if _is_inside(self.output_uri, self.input_uri):
            raise ValueError(
                f"output_uri={self.output_uri!r} is inside input_uri={self.input_uri!r}: the job would "
                "read its own staging and earlier outputs as input rows. Write the outputs beside the "
                "input folder."
            )
        return self

    def _check_openai_fields(self) -> None:
        """With openai_endpoint, each line's body is the prompt: row-shaping fields do not apply."""
        row_fields = (
            "messages_column",
            "user_template",
            "system_prompt",
            "image_column",
            "preprocess",
            "postprocess",
            "id_column",
            "keep_columns",
        )
        for name in row_fields:
            if getattr(self, name) is not None:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} does not apply with openai_endpoint="
                    f"{self.openai_endpoint!r}: each line's body is the request, custom_id its id."
                )
        for name, expected in (("input_format", "jsonl"), ("output_format", "jsonl")):
            if getattr(self, name) != expected:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} does not apply with openai_endpoint: OpenAI batch "
                    "files are JSONL in and out; leave it unset."
                )

    def _check_image_fields(self) -> None:
        column = self.image_column
        if column is None:
            for name in ("image_size", "image_max_side"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name}={getattr(self, name)!r} needs image_column; set image_column='image'."
                    )
            return
        if self.user_template is None:
            raise ValueError(
                f"image_column={column!r} needs user_template (the text after the image), "
                "not messages_column."
            )
        if column in template_fields(self.user_template):
            raise ValueError(
                f"image_column={column!r} is also a field of user_template={self.user_template!r}; the image "
                "goes to the model as an image, so remove {" + column + "} from the template."
            )
        if column == self.id_column:
            raise ValueError(f"image_column={column!r} is also id_column; an image cannot identify a row.")
        if column in (self.keep_columns or []):
            raise ValueError(
                f"image_column={column!r} is in keep_columns={self.keep_columns!r}; images are never copied "
                "to the outputs: drop it from keep_columns."
            )
        if self.image_size is not None and self.image_size[0] * self.image_size[1] > MAX_IMAGE_PIXELS:
            raise ValueError(
                f"image_size={self.image_size!r} is {self.image_size[0] * self.image_size[1]:,} pixels, over "
                f"the {MAX_IMAGE_PIXELS:,} an image part may hold; vision models take far fewer "
                "(e.g. (448, 448))."
            )
        if self.image_size is not None and self.image_max_side is not None:
            raise ValueError(
                f"image_size={self.image_size!r} and image_max_side={self.image_max_side!r} are exclusive: "
                "pass a fixed (width, height) or a longest side, not both."
            )
        limit = self.engine_kwargs.get("limit_mm_per_prompt")
        if limit is not None and (
            not isinstance(limit, dict)
            or not isinstance(limit.get("image"), int)
            or isinstance(limit.get("image"), bool)
            or limit["image"] < 1
        ):
            raise ValueError(
                f"engine_kwargs['limit_mm_per_prompt']={limit!r} must allow images with "
                f"image_column={column!r}: use {{'image': 1}} (one image per row), or leave it unset."
            )

    @classmethod
    def build(cls, **params: ArgValue) -> BatchInferenceSpec:
        """Validate ``params`` into a spec, turning pydantic's report into one :class:`BatchSpecError`."""
        try:
            return cls(**params)
        except ValidationError as err:
            raise BatchSpecError(_describe(err.errors(), params)) from None  # no pydantic traceback first

    @classmethod
    def check_fields(cls, params: Kwargs) -> None:
        """Raise :class:`BatchSpecError` for the mistakes of ``params``, the fields written as they are:
        each field's own checks, and the checks across fields that involve only these. The other
        fields wait for the values a run renders: a required one stands in as a placeholder, an
        optional one as its default, and a check across fields that names one of them (or a
        placeholder) waits too."""
        waiting = [name for name in cls.model_fields if name not in params]
        stand_ins = {name: value for name, value in _PLACEHOLDERS.items() if name in waiting}
        prompt_sources = ("messages_column", "preprocess", "openai_endpoint")
        if "user_template" in waiting and not any(params.get(name) for name in prompt_sources):
            # A templated prompt (a daily DAG's date in it): the checks that follow the prompt's run too.
            stand_ins["user_template"] = "{" + _PLACEHOLDER + "}"
        try:
            cls(**{**stand_ins, **params})
        except ValidationError as err:
            own = [problem for problem in err.errors() if problem["loc"] and problem["loc"][0] in params]
            across = [
                problem
                for problem in err.errors()
                if not problem["loc"] and not _names_any(problem["msg"], [*waiting, _PLACEHOLDER])
            ]
            if own or across:
                raise BatchSpecError(_describe(own + across, params)) from None

    @classmethod
    def from_json(cls, payload: str) -> BatchInferenceSpec:
        """Rebuild a spec shipped with :meth:`model_dump_json` (the pipeline's side)."""
        try:
            return cls.model_validate_json(payload)
        except ValidationError as err:
            raise BatchSpecError(_describe(err.errors())) from None  # no pydantic traceback first

    @property
    def resolved_input_format(self) -> InputFormat:
        """``input_format``, or the one named by the input's suffix."""
        return self.input_format or infer_input_format(self.input_uri)

    @property
    def structured_choices(self) -> list[str] | None:
        """The labels of a ``choice`` structured output, if the spec constrains output to one."""
        structured = self.sampling_params.get("structured_outputs") or {}
        return list(structured["choice"]) if "choice" in structured else None

    def fingerprint(self) -> str:
        """A stable hash of everything that shapes the output; equal specs give equal fingerprints.

        ``run_key``, ``keep_versions``, ``model_cache_dir`` and ``compile_cache_dir`` say where and how
        long, not what, so they are left out: a retry with the same parameters may resume what an
        earlier try staged. So are the failed-row thresholds, which judge the output without shaping
        it: a run that failed its threshold, retried with a looser one, takes the committed result.
        """
        where = {
            "run_key",
            "keep_versions",
            "model_cache_dir",
            "compile_cache_dir",
            "keep_warm_seconds",
            "max_failed_fraction",
            "max_failed_rows",
            "dry_run_rows_per_second",
        }
        shaping = self.model_dump(mode="json", exclude=where)
        canonical = json.dumps(shaping, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


#: Sampling fields a row batch cannot honour: its output is one text per row (an OpenAI batch line
#: can: its response holds every choice and the log probabilities).
_ONE_TEXT_PER_ROW = {
    "n": "a row gets one answer; ask for more in preprocess (one row per sample) or use openai_endpoint",
    "logprobs": "outputs carry no log probabilities; use openai_endpoint for them",
    "prompt_logprobs": "outputs carry no log probabilities; use openai_endpoint for them",
}


def check_sampling_params(
    value: ArgValue, *, one_text_per_row: bool = False, name: str = "sampling_params"
) -> None:
    """Raise ValueError naming the field when vLLM's SamplingParams would reject ``value`` or this
    pipeline could not honour it (never drop a setting silently).

    :param one_text_per_row: a row batch (not an OpenAI batch): ``n`` > 1 and log probabilities refused.
    """
    if not isinstance(value, dict):
        raise ValueError(
            f"{name}={value!r} must be a dict of vLLM SamplingParams, e.g. {{'max_tokens': 16}}."
        )
    unknown = sorted(set(value) - VLLM_SAMPLING_PARAMS)
    if unknown:
        raise ValueError(unknown_keys_message(name, unknown, VLLM_SAMPLING_PARAMS, RENAMED_SAMPLING_KEYS))
    max_tokens = value.get("max_tokens")
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise ValueError(f"{name}['max_tokens']={max_tokens!r} must be an int >= 1.")
    temperature = value.get("temperature")
    if temperature is not None and (
        not isinstance(temperature, int | float) or isinstance(temperature, bool) or temperature < 0
    ):
        raise ValueError(f"{name}['temperature']={temperature!r} must be a number >= 0.")
    if value.get("detokenize", True) is not True:
        raise ValueError(
            f"{name}['detokenize']={value['detokenize']!r} is not supported: outputs are the generated "
            "text; leave detokenize unset."
        )
    if one_text_per_row:
        for key, why in _ONE_TEXT_PER_ROW.items():
            if value.get(key) not in (None, 1 if key == "n" else None):
                raise ValueError(f"{name}['{key}']={value[key]!r} is not supported for rows: {why}.")
    structured = value.get("structured_outputs")
    if structured is not None:
        _check_structured_outputs(structured, name)
    _check_json_serializable(name, value)
    from airflow_provider_raybatch.shared.json_numbers import unsafe_number

    bad_number = unsafe_number(value, name)
    if bad_number is not None:  # a seed past int64, a NaN temperature: vLLM gets numbers, not text
        raise ValueError(bad_number[1])


def _check_structured_outputs(structured: ArgValue, name: str = "sampling_params") -> None:
    if not isinstance(structured, dict):
        raise ValueError(
            f"{name}['structured_outputs']={structured!r} must be a dict, e.g. {{'choice': [...]}}."
        )
    unknown = sorted(set(structured) - STRUCTURED_OUTPUT_KINDS - STRUCTURED_OUTPUT_OPTIONS)
    if unknown:
        raise ValueError(
            unknown_keys_message(
                f"{name}['structured_outputs']",
                unknown,
                STRUCTURED_OUTPUT_KINDS | STRUCTURED_OUTPUT_OPTIONS,
                RENAMED_STRUCTURED_OUTPUT_KEYS,
            )
        )
    kinds = sorted(set(structured) & STRUCTURED_OUTPUT_KINDS)
    if len(kinds) != 1:
        raise ValueError(
            f"{name}['structured_outputs'] must set exactly one of {sorted(STRUCTURED_OUTPUT_KINDS)}, "
            f"got {kinds}."
        )
    if "json" in structured:
        _check_json_schema(structured["json"], f"{name}['structured_outputs']['json']")
    if "choice" in structured:
        choice = structured["choice"]
        if (
            not isinstance(choice, list | tuple)
            or not choice
            or not all(isinstance(c, str) and c for c in choice)
        ):
            raise ValueError(
                f"{name}['structured_outputs']['choice']={choice!r} must be a non-empty list of "
                "non-empty strings."
            )


def _check_json_schema(schema: ArgValue, where: str) -> None:
    """A ``json`` structured output is a JSON schema without misspellings (shared/json_schema.py)."""
    problem = schema_problem(schema, where)
    if problem is not None:
        raise ValueError(problem)


def parse_allowed_host_entry(
    entry: str, name: str = "image_allowed_hosts"
) -> tuple[str | ipaddress.IPv4Network | ipaddress.IPv6Network, int | None]:
    """An ``image_allowed_hosts`` entry as (host or network, port or None for every port).

    ``host:port``, ``1.2.3.4:port`` and ``[v6]:port`` carry a port; a bare IPv6 address or a CIDR block
    does not. Raises ValueError naming ``name``.
    """
    text = entry.strip() if isinstance(entry, str) else ""
    if "://" in text:
        raise ValueError(f"{name}={entry!r}: give the host (and port), without a scheme or path.")
    host, port_text = text, None
    if text.startswith("[") and "]:" in text:
        host, port_text = text[1 : text.index("]:")], text[text.index("]:") + 2 :]
    elif text.count(":") == 1 and "/" not in text:
        host, port_text = text.split(":")
    port = None
    if port_text is not None:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"{name}={entry!r}: the port must be a number from 1 to 65535.")
        port = int(port_text)
    return parse_allowed_host(host, name), port


def parse_allowed_host(
    entry: str, name: str = "image_allowed_hosts"
) -> str | ipaddress.IPv4Network | ipaddress.IPv6Network:
    """An ``image_allowed_hosts`` entry: a host name (lower case, no trailing dot) or an IP network.

    Raises ValueError naming ``name``. Shared by the spec and the pipeline's image policy
    (``pipeline/read/image_sources.py``), so the two read an entry the same way.
    """
    text = entry.strip().lower() if isinstance(entry, str) else ""
    text = text[1:-1] if text.startswith("[") and text.endswith("]") else text  # [::1], as in a URL
    try:
        return ipaddress.ip_network(text, strict=True)  # an address is a network of one
    except ValueError as err:
        if "/" in text and "://" not in text:
            raise ValueError(f"{name}={entry!r} is not a CIDR block: {err}; e.g. '10.0.0.0/8'.") from err
    host = text.removesuffix(".")
    if not _HOST_NAME.match(host) or host.replace(".", "").isdigit():
        raise ValueError(
            f"{name}={entry!r} is not a host name, IP address or CIDR block; pass e.g. "
            "'images.internal:8080', '10.1.2.3' or '10.0.0.0/8', without a scheme or path."
        )
    return host


def check_allowed_local_path(path: str, name: str = "image_allowed_local_path") -> None:
    """An extra local image folder must be an absolute path on the cluster's nodes; raises ValueError."""
    if not path.startswith("/") or "://" in path or "\x00" in path:
        raise ValueError(
            f"{name}={path!r} must be an absolute folder on the cluster's nodes, e.g. '/data/images' "
            "(no scheme; s3:// folders go in image_allowed_s3_prefixes)."
        )


def parse_s3_prefix(prefix: str, name: str = "image_allowed_s3_prefixes") -> tuple[str, str]:
    """An ``s3://bucket[/folder]`` prefix as (bucket, folder key without end slashes); raises ValueError."""
    bucket, _, key = prefix.removeprefix("s3://").partition("/")
    steps = key.strip("/").split("/")
    if not prefix.startswith("s3://") or not bucket or "." in steps or ".." in steps:
        raise ValueError(
            f"{name}={prefix!r} must be an s3:// folder without '.' or '..' steps, e.g. 's3://bucket/images'."
        )
    return bucket, key.strip("/")


def _is_inside(uri: str, folder: str) -> bool:
    """``uri`` lies under ``folder`` (same scheme; ``.`` and ``..`` steps resolved, no file system)."""
    import posixpath

    def normal(value: str) -> str:
        scheme, sep, path = value.rpartition("://")
        return f"{scheme}{sep}{posixpath.normpath('/' + path.removeprefix('file://'))}"

    return normal(uri).startswith(normal(folder).rstrip("/") + "/")


#: A text that names a remote source: a scheme, then ``://`` (vLLM trims spaces from paths it takes).
_REMOTE_SOURCE = re.compile(r"^\s*[A-Za-z][A-Za-z0-9+.-]*://")
#: engine_kwargs that take a URL and fetch nothing from it: where vLLM sends its traces.
_URL_ENGINE_KWARGS = frozenset({"otlp_traces_endpoint"})


def _check_no_remote_sources(name: str, value: ArgValue, path: str = "") -> None:
    """Refuse a remote source (``gs://``, ``s3://``, ``http://`` ...) anywhere in ``value``: vLLM fetches
    a tokenizer, a draft model or a config from one itself (``engine_kwargs['tokenizer']='gs://...'``
    pulled the folder, its code included, with the node's own credentials), outside the model cache
    that is checked. A hub id or a local folder there is taken as ``model=`` takes one."""
    if isinstance(value, str) and _REMOTE_SOURCE.match(value) and path.strip("[]'") not in _URL_ENGINE_KWARGS:
        raise ValueError(
            f"{name}{path}={value!r} names a remote source, which vLLM would fetch itself with the node's "
            "own settings, outside the checked model cache: use a local folder (or the model's own, "
            "leaving it unset)."
        )
    if isinstance(value, dict):
        for key, item in value.items():
            _check_no_remote_sources(name, item, f"{path}[{key!r}]")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_no_remote_sources(name, item, f"{path}[{index}]")


def _check_json_serializable(name: str, value: ArgValue) -> None:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be JSON-serializable to ship to the cluster: {err}.") from err


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the known name closest to a misspelled ``word``, or ``""``."""
    close = difflib.get_close_matches(word, sorted(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


#: SamplingParams keys of older vLLM releases and of other libraries, and what this vLLM takes instead.
RENAMED_SAMPLING_KEYS = {
    "guided_decoding": "structured_outputs (vLLM's name for it now)",
    "guided_choice": "structured_outputs={'choice': [...]}",
    "guided_json": "structured_outputs={'json': {...}}",
    "guided_regex": "structured_outputs={'regex': '...'}",
    "guided_grammar": "structured_outputs={'grammar': '...'}",
    "guided_json_object": "structured_outputs={'json_object': True}",
    "max_new_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens",
    "stop_sequences": "stop",
    "json_schema": "structured_outputs={'json': <the JSON schema>}",
    "response_format": "structured_outputs={'json': <the JSON schema>} or {'json_object': True}; "
    "OpenAI's request body takes response_format in an OpenAI batch file (openai_endpoint)",
}
#: Keys of structured_outputs as other APIs name them (OpenAI's response_format), and vLLM's instead.
RENAMED_STRUCTURED_OUTPUT_KEYS = {
    "json_schema": "'json': the JSON schema itself, e.g. {'json': {'type': 'object', ...}}",
    "schema": "'json': the JSON schema itself, e.g. {'json': {'type': 'object', ...}}",
    "type": "one key naming the kind, e.g. {'json': <schema>}, {'choice': [...]} or {'regex': '...'}",
}


def unknown_keys_message(
    name: str, unknown: list[str], known: Iterable[str], renamed: dict[str, str] | None = None
) -> str:
    """The error for keys of ``name`` that are not in ``known``: each with what it is called now
    (``renamed``) or its likely spelling; the allowed keys listed only where no key has either."""
    renamed = renamed or {}

    def hint(key: str) -> str:
        return f" (use {renamed[key]})" if key in renamed else did_you_mean(key, known)

    named = ", ".join(f"{key!r}{hint(key)}" for key in unknown)
    plural = "s" if len(unknown) > 1 else ""
    if any(hint(key) for key in unknown):
        return f"{name} has unknown key{plural} {named}."
    return f"{name} has unknown key{plural} {named}; allowed: {sorted(known)}."


#: What stands in for a required field that is templated, while the fields written as they are are
#: checked as the DAG is parsed (BatchInferenceSpec.check_fields).
_PLACEHOLDER = "raybatch-placeholder"
_PLACEHOLDERS = {
    "model": _PLACEHOLDER,
    "input_uri": f"s3://{_PLACEHOLDER}/in.jsonl",
    "output_uri": f"s3://{_PLACEHOLDER}/out",
    "run_key": _PLACEHOLDER,
}


def _names_any(message: str, words: Iterable[str]) -> bool:
    return any(re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", message) for word in words)


#: Pydantic's error types, in the words of an expected value (a union's members are listed together).
_EXPECTED = {
    "int_type": "an int",
    "int_parsing": "an int",
    "int_from_float": "an int",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "dict_type": "a dict",
    "list_type": "a list",
    "string_too_short": "a non-empty string",
}
#: Pydantic's bound checks, in words: the bound is the error's context value of that key.
_BOUNDS = {
    "greater_than": ("gt", "greater than"),
    "greater_than_equal": ("ge", "at least"),
    "less_than": ("lt", "less than"),
    "less_than_equal": ("le", "at most"),
}
#: The parameters that take a pair, and what the pair is: a problem with the pair or inside it says so.
_PAIRS = {"concurrency": "a (min, max) pair of ints > 0", "image_size": "a (width, height) pair of ints > 0"}
_PAIR_PROBLEMS = ("tuple_type", "too_long", "too_short")


def _expected(field: str, problem: ErrorDetails) -> str | None:
    """What ``field`` must be, in words, from one of pydantic's problems with it; None where the
    problem's own message says more (a value check of ours)."""
    kind, ctx, inner = problem["type"], problem.get("ctx") or {}, [str(part) for part in problem["loc"][1:]]
    inside_a_pair = any(part.startswith("tuple[") or part.isdigit() for part in inner)
    if field in _PAIRS and (kind in _PAIR_PROBLEMS or inside_a_pair):
        return _PAIRS[field]
    if kind in _BOUNDS:
        key, words = _BOUNDS[kind]
        number = "an int " if any(part.endswith("-int") or part == "int" for part in inner) else ""
        return f"{number}{words} {ctx[key]}"
    return _EXPECTED.get(kind)


def _takes_a_dict(field: str) -> bool:
    """Whether ``field`` is a dict parameter (a problem inside it is located by the key)."""
    spec_field = BatchInferenceSpec.model_fields.get(field)
    annotation = spec_field.annotation if spec_field else None
    union = typing.get_origin(annotation) in (Union, UnionType)
    members = typing.get_args(annotation) if union else (annotation,)
    return any(typing.get_origin(member) is dict or member is dict for member in members)


def _describe(problems: Iterable[ErrorDetails], values: Kwargs | None = None) -> str:
    """One readable line per parameter, each naming it (and the key, inside a dict): no pydantic type
    names, and a check of the whole spec (a model validator) names its fields without repeating it.

    :param values: the parameters checked, to show a whole value where the problem is inside it.
    """
    by_field: dict[str, list[ErrorDetails]] = {}
    for problem in problems:
        field = str(problem["loc"][0]) if problem["loc"] else ""
        if field and len(problem["loc"]) > 1 and _takes_a_dict(field):
            field = f"{field}[{problem['loc'][1]!r}]"
        by_field.setdefault(field, []).append(problem)
    lines = []
    for field, problems in by_field.items():
        first = problems[0]
        if first["type"] == "extra_forbidden":
            lines.append(f"{field}: unknown parameter{did_you_mean(field, BatchInferenceSpec.model_fields)}")
            continue
        if not field:  # a check across fields: its message names them
            lines.extend(problem["msg"].removeprefix("Value error, ") for problem in problems)
            continue
        value = values[field] if values is not None and field in values else first.get("input")
        shown = _shorten(repr(value), 120)
        expected = [words for problem in problems if (words := _expected(field.split("[")[0], problem))]
        if expected and len(expected) == len(problems):  # a type or bound check, or each member of a union
            lines.append(f"{field}={shown} must be {' or '.join(dict.fromkeys(expected))}")
            continue
        message = first["msg"].removeprefix("Value error, ")
        lines.append(message if field in message else f"{field}: {message} (got {shown})")
    return "Invalid batch job spec: " + "; ".join(line.rstrip(".") for line in lines) + "."
