"""A dry run: the whole job but the engine, so that a day or a month of input is checked before GPUs.

It reads, validates and dedupes every row as a real run does (:mod:`.run`, :mod:`.dedupe`), renders
every good row's prompt with the model's chat template (our chat-template UDF, as the engine stage
gets it) and counts its tokens with the model's tokenizer (Ray Data LLM's tokenize UDF), in an
autoscaling pool of CPU actors. Each batch comes back as one summary row (token total, histogram,
reasons), so the driver adds up batches, never rows.

What it writes: ``<output_uri>/_dry_runs/<run_key>/manifest.json`` and ``report.html``. It never
touches the committed versions, ``manifest.json`` at ``output_uri`` or an earlier try's staging.

What it predicts: rows that would fail before the engine (bad rows, duplicate ids, a conversation the
chat template rejects, a prompt longer than ``max_model_len``), prompt tokens, the most output tokens
``max_tokens`` allows, and engine and GPU time (:func:`engine_estimate`) at a throughput the author
states (``dry_run_rows_per_second``) or, failing that, the one the last committed run at
``output_uri`` measured. Image rows' image tokens are not counted (the model's processor expands
them in the engine).
"""

from __future__ import annotations

import html
import json
import logging
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_raybatch.pipeline import row_steps, storage
from airflow_provider_raybatch.pipeline.stage.commit import reason_kind
from airflow_provider_raybatch.shared.json_types import JsonObject, JsonValue, Row
from airflow_provider_raybatch.shared.layout import LayoutPlan, plan_layout
from airflow_provider_raybatch.shared.manifest import (
    MANIFEST_FILE_NAME,
    dry_run_uri,
)
from airflow_provider_raybatch.shared.run_manifest import DRY_RUN_STATUS, DryRunManifest, RunManifest
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

if TYPE_CHECKING:
    from ray.data import Dataset

log = logging.getLogger("airflow_provider_raybatch.pipeline")

REPORT_FILE_NAME = "report.html"
PROMPT_TOO_LONG = "prompt too long"
#: Upper bounds of the prompt-token histogram's buckets; one more bucket holds the longer prompts.
TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
_SUMMARY_SCHEMA = pa.schema(
    [
        ("rows", pa.int64()),
        ("tokens", pa.int64()),
        ("longest", pa.int64()),
        ("histogram", pa.list_(pa.int64())),
        ("reasons", pa.string()),
    ]
)


@dataclass
class TokenSummary:
    """What the batches add up to: good rows with their prompt tokens, and failures by reason."""

    rows: int = 0
    tokens: int = 0
    longest: int = 0
    histogram: list[int] = field(default_factory=lambda: [0] * (len(TOKEN_BUCKETS) + 1))
    reasons: Counter[str] = field(default_factory=Counter)

    def add_prompt(self, tokens: int) -> None:
        self.rows += 1
        self.tokens += tokens
        self.longest = max(self.longest, tokens)
        self.histogram[
            next((i for i, bound in enumerate(TOKEN_BUCKETS) if tokens <= bound), len(TOKEN_BUCKETS))
        ] += 1

    def add(self, other: TokenSummary) -> None:
        self.rows += other.rows
        self.tokens += other.tokens
        self.longest = max(self.longest, other.longest)
        self.histogram = [a + b for a, b in zip(self.histogram, other.histogram, strict=True)]
        self.reasons.update(other.reasons)

    def as_table(self) -> pa.Table:
        row = {
            "rows": self.rows,
            "tokens": self.tokens,
            "longest": self.longest,
            "histogram": self.histogram,
            "reasons": json.dumps(dict(self.reasons)),
        }
        return pa.Table.from_pylist([row], schema=_SUMMARY_SCHEMA)

    @classmethod
    def of_row(cls, row: Row) -> TokenSummary:
        return cls(
            row["rows"],
            row["tokens"],
            row["longest"],
            list(row["histogram"]),
            Counter(json.loads(row["reasons"])),
        )


class PromptTokenCounter:
    """A Ray Data callable class: each good row's prompt as the engine would get it, counted in tokens.

    :param model_source: the model folder or id the engine loads (its tokenizer and chat template).
    :param max_model_len: prompts longer than this would fail in the engine (None: the model's own).
    :param model_copy_root: the ``model_cache_dir`` of a copy the driver fetched, checked on this
        node before anything loads from it, as the real run's stages do (another local user could
        have made that path here: their tokenizer would count the tokens).
    """

    def __init__(
        self, model_source: str, max_model_len: int | None, model_copy_root: str | None = None
    ) -> None:
        from ray.llm._internal.batch.stages.tokenize_stage import TokenizeUDF

        from airflow_provider_raybatch.pipeline.generate import models
        from airflow_provider_raybatch.pipeline.prompt.chat_template import RaybatchChatTemplateUDF

        if model_copy_root is not None:
            models.check_copy_in_replica(model_source, model_copy_root)
        self._chat = RaybatchChatTemplateUDF(
            data_column="__raybatch", expected_input_keys=["messages"], model=model_source
        )
        self._tokenizer = TokenizeUDF(
            data_column="__raybatch", expected_input_keys=["prompt"], model=model_source
        ).tokenizer
        self._max_model_len = max_model_len or _model_max_len(model_source)

    def __call__(self, batch: pa.Table) -> pa.Table:
        from airflow_provider_raybatch.pipeline.prompt.chat_template import (
            CHAT_TEMPLATE_FAILED,
            conversation_of,
        )

        summary = TokenSummary()
        texts: list[str] = []
        for row in batch.filter(pc.is_null(batch["error"])).to_pylist():  # failed rows: reasons_in_batch
            request = row_steps.engine_request(row, with_images=False)
            prompt = request.get("prompt")
            if request.get("messages") is not None:
                try:
                    prompt = self._chat._render(conversation_of(request["messages"]))
                except Exception as err:  # noqa: BLE001 - this row's conversation, as in the real run
                    summary.reasons[f"{CHAT_TEMPLATE_FAILED}: {type(err).__name__}"] += 1
                    continue
            if isinstance(prompt, list) and all(isinstance(token, int) for token in prompt):
                self._count(summary, len(prompt))  # token ids already (an OpenAI completions line)
            else:
                texts.append(prompt if isinstance(prompt, str) else json.dumps(prompt))
        for ids in self._tokenizer(texts)["input_ids"] if texts else []:
            self._count(summary, len(ids))
        return summary.as_table()

    def _count(self, summary: TokenSummary, tokens: int) -> None:
        if self._max_model_len is not None and tokens > self._max_model_len:
            summary.reasons[PROMPT_TOO_LONG] += 1  # vLLM rejects a prompt longer than max_model_len
        else:
            summary.add_prompt(tokens)


def _model_max_len(model_source: str) -> int | None:
    """The model's context length from its config, as vLLM derives max_model_len by default."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_source)
    except Exception:  # noqa: BLE001 - no config, no check: the real run would tell
        return None
    length = getattr(config, "max_position_embeddings", None)
    return int(length) if isinstance(length, int) else None


def reasons_in_batch(batch: pa.Table) -> pa.Table:
    """The rows of a batch that failed before the engine, as one summary row of their reason kinds."""
    summary = TokenSummary()
    errors = pc.drop_null(batch["error"]).to_pylist()
    summary.reasons.update(reason_kind(error) for error in errors)
    return summary.as_table()


def _total(summaries: Dataset) -> TokenSummary:
    total = TokenSummary()
    for batch in summaries.iter_batches(batch_format="pyarrow", batch_size=4096):  # a row per batch
        for row in batch.to_pylist():
            total.add(TokenSummary.of_row(row))
    return total


class MeasuredRate(NamedTuple):
    """What the last committed run at ``output_uri`` measured: rows per second, and the engine start-up."""

    rows_per_second: float
    startup_seconds: float  # 0 where the run's manifest has no timings (its rate then includes it)
    source: str


def _measured_rate(output_uri: str) -> MeasuredRate | None:
    """The last committed run's rate at ``output_uri`` (None without a real run there).

    Why not its rows over its wall time: a short run is mostly engine start-up, and a backfill's
    estimate scaled from it would be many times too long (a 3,000-row run: 47 rows/s end to end,
    256 while generating). Where the manifest has its ``timings``, the rate is the rows the engine
    generated over the seconds it generated them, and the start-up is counted once, apart.

    The rows are the measured try's own (:func:`_rows_generated`): a try that resumed 900 of 1,000
    rows from an earlier try's staging generated 100 in its ``generating_s``, and its ``rows_out``
    over that would make a backfill look ten times as fast as it is.
    """
    uri = storage.join(output_uri, MANIFEST_FILE_NAME)
    try:
        if not storage.exists(uri, within=output_uri):
            return None
        manifest = RunManifest.model_validate_json(storage.read_text(uri, within=output_uri))
        timings = manifest.timings or {}
        resumed = manifest.rows_resumed or 0
        held = manifest.held_try
        if not timings.get("generating_s") and held is not None:
            # It committed a held try's rows and started no engine: that try generated them.
            timings = held.timings or {}
            resumed = 0  # this try's resumed rows are the held ones; what that try resumed is unrecorded
        generating = float(timings.get("generating_s") or 0)
        generated = _rows_generated(timings, manifest.rows_out - resumed)
        if generated > 0 and generating > 0:
            startup = float(timings.get("engine_start_to_first_row_s") or 0)
            return MeasuredRate(generated / generating, startup, "last run, while generating")
        rows = manifest.rows_in - (manifest.rows_resumed or 0)
        seconds = manifest.wall_seconds or 0.0
    except (OSError, ValueError, TypeError):
        return None
    return MeasuredRate(rows / seconds, 0.0, "last run") if rows > 0 and seconds > 0 else None


def _rows_generated(timings: JsonObject, rows_out_not_resumed: int) -> int:
    """The rows the measured try's engines generated: its ``timings.rows_generated``; for a manifest
    from before that count, its rows out less the rows it resumed (short by the resumed error rows,
    so the rate errs slow, never fast)."""
    counted = timings.get("rows_generated")
    if isinstance(counted, int) and not isinstance(counted, bool):
        return counted
    return max(rows_out_not_resumed, 0)


def engine_estimate(
    rows: int, rate: float | None, startup_seconds: float, plan: LayoutPlan
) -> dict[str, Any]:
    """The manifest's ``estimated_engine_seconds`` and ``estimated_gpu_seconds`` for ``rows`` at ``rate``.

    Engine seconds: the start-up once, then the rows at ``rate`` (the rows per second of all replicas
    together, as a run measures them). GPU-seconds: every replica holds its GPUs for all of them, so
    replicas x GPUs per replica x those seconds, as a run's ``timings.gpu_seconds_held`` counts what it
    held (reporting/timings.py); 0 for a CPU engine. The engine seconds alone would be a quarter of the
    GPU time of a 4-replica layout.
    """
    if not rate:
        return {"estimated_engine_seconds": None, "estimated_gpu_seconds": None}
    seconds = startup_seconds + rows / rate
    gpus = plan.max_replicas * plan.gpus_per_replica
    return {
        "estimated_engine_seconds": math.ceil(seconds),
        "estimated_gpu_seconds": math.ceil(gpus * seconds),
    }


def _counted(
    spec: BatchInferenceSpec, prepared: Dataset, model_source: str, model_copy_root: str | None
) -> TokenSummary:
    """The good rows' prompt tokens, and every failed row's reason."""
    import ray

    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    counted = prepared.map_batches(  # good rows only: the counter drops the failed ones per batch
        PromptTokenCounter,
        fn_constructor_kwargs={
            "model_source": model_source,
            "max_model_len": spec.engine_kwargs.get("max_model_len"),
            "model_copy_root": model_copy_root,
        },
        batch_format="pyarrow",
        batch_size=1024,
        concurrency=(1, cpus),
    )
    total = _total(counted)
    total.add(_total(prepared.map_batches(reasons_in_batch, batch_format="pyarrow")))
    return total


def run_dry(
    spec: BatchInferenceSpec,
    prepared: Dataset,
    rows_in: int,
    rows_repeated: int,
    model_source: str,
    started_at: datetime,
    job_id: str | None,
    versions: dict[str, str] | None = None,
    model_copy_root: str | None = None,
) -> JsonObject:
    """Count, render and tokenize the prepared (validated, deduped) rows; write and return the manifest.

    :param rows_repeated: the rows whose id another row has too, less one per id (the manifest's
        ``rows_duplicate``: :func:`.read.dedupe.find_first_sources`).
    :param model_copy_root: the ``model_cache_dir`` of a copy the driver fetched (None: no copy).
    """
    total = _counted(spec, prepared, model_source, model_copy_root)
    rows_failed = sum(total.reasons.values())
    if total.rows + rows_failed != rows_in:
        raise RuntimeError(f"dry run counted {total.rows} good and {rows_failed} failed rows of {rows_in}")
    max_tokens = spec.sampling_params.get("max_tokens")
    stated = spec.dry_run_rows_per_second
    measured = None if stated else _measured_rate(spec.output_uri)
    rate = stated or (measured.rows_per_second if measured else None)
    startup = measured.startup_seconds if measured else 0.0
    folder = dry_run_uri(spec.output_uri, spec.run_key)
    manifest = DryRunManifest(
        status=DRY_RUN_STATUS,
        dry_run=True,
        model=spec.model,
        input_uri=spec.input_uri,
        output_uri=spec.output_uri,
        dry_run_uri=folder,
        rows_in=rows_in,
        rows_out=total.rows,  # rows that would reach the engine with a prompt it takes
        rows_failed=rows_failed,
        rows_duplicate=rows_repeated,
        errors_by_reason=dict(sorted(total.reasons.items())),
        prompt_tokens=total.tokens,
        prompt_tokens_longest=total.longest,
        prompt_tokens_histogram=_histogram(total.histogram),
        output_tokens_at_most=total.rows * int(max_tokens) if isinstance(max_tokens, int) else None,
        rows_per_second=round(rate, 3) if rate else None,
        rows_per_second_from="dry_run_rows_per_second" if stated else (measured.source if measured else None),
        # the engine's start-up as the last run measured it, counted once (0: stated rate, or not measured)
        estimated_startup_seconds=round(startup, 1),
        **engine_estimate(total.rows, rate, startup, plan_layout(spec)),
        started_at=started_at.isoformat(),
        finished_at=datetime.now(UTC).isoformat(),
        run_key=spec.run_key,
        spec_fingerprint=spec.fingerprint(),
        job_id=job_id,
        versions=dict(versions or {}),
    ).to_json()
    write_dry_run(spec.output_uri, folder, manifest, render_report(manifest))
    log.info(
        "Dry run: %d rows in, %d would reach the engine (%d prompt tokens), %d would fail.",
        rows_in,
        total.rows,
        total.tokens,
        rows_failed,
    )
    return manifest


def write_dry_run(output_uri: str, folder: str, manifest: JsonObject, page: str) -> None:
    """Write a dry run's report ``page`` and manifest into ``folder`` of the output, never through a
    link below the output folder: a link at the dry run's folder (or on the way) refuses, naming it
    (:class:`..shared.local_tree.LinkInOutputError`)."""
    storage.write_text(storage.join(folder, REPORT_FILE_NAME), page, within=output_uri)
    storage.write_text(
        storage.join(folder, MANIFEST_FILE_NAME), json.dumps(manifest, indent=2), within=output_uri
    )


def _histogram(counts: list[int]) -> list[JsonObject]:
    """Rows per bucket of prompt tokens, shortest first (a list: the manifest's log line sorts dict keys)."""
    buckets: list[dict[str, Any]] = [
        {"tokens_at_most": bound, "rows": count} for bound, count in zip(TOKEN_BUCKETS, counts, strict=False)
    ]
    buckets.append({"tokens_over": TOKEN_BUCKETS[-1], "rows": counts[-1]})
    return buckets


def _histogram_rows(buckets: list[JsonObject]) -> list[tuple[str, int]]:
    return [
        (f"<= {b['tokens_at_most']}" if "tokens_at_most" in b else f"> {b['tokens_over']}", b["rows"])
        for b in buckets
    ]


def render_report(manifest: JsonObject) -> str:
    """A one-page HTML report of the dry run: counts, reasons, the token histogram, the estimate."""

    def rows(pairs: Iterable[tuple[str, JsonValue]]) -> str:
        return "".join(
            f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in pairs
        )

    keys = """
        model input_uri rows_in rows_out rows_failed rows_duplicate prompt_tokens prompt_tokens_longest
        output_tokens_at_most rows_per_second rows_per_second_from estimated_startup_seconds
        estimated_engine_seconds estimated_gpu_seconds
    """.split()
    counts = [(key, manifest[key]) for key in keys]
    return (
        "<!doctype html><meta charset='utf-8'><title>Dry run</title>"
        "<h1>Dry run (nothing was generated)</h1>"
        f"<table>{rows(counts)}</table><h2>Rows that would fail, by reason</h2>"
        f"<table>{rows(manifest['errors_by_reason'].items())}</table><h2>Prompt tokens per row</h2>"
        f"<table>{rows(_histogram_rows(manifest['prompt_tokens_histogram']))}</table>"
    )
