"""The run report: one self-contained HTML page written beside a version's outputs (``report.html``).

The sink adds what the report needs to each part's sidecar (:func:`part_report_fields`): when the
part was written, and how its output rows' token counts spread over power-of-two buckets, so a
sidecar stays a few hundred bytes however many rows its part holds. Commit folds the sidecars into
:class:`ReportStats` and renders the page with :func:`render_report`.

Sidecars staged before these fields existed (a run resumed across an upgrade) still count in the
totals; the charts then cover the parts that carry them and say how many rows they leave out.

The page fetches nothing (no scripts, stylesheets or fonts): the charts are inline SVG and the style
is inline CSS. Every string that comes from the run (model, URIs, error kinds, labels) is escaped.
Pure Python, no Ray or pyarrow, so it is tested without a cluster.
"""

from __future__ import annotations

import html
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from airflow_provider_raybatch.shared.json_types import CellValue, JsonObject, JsonValue, Row

#: The report's file name inside ``versions/<version>/``.
REPORT_FILE_NAME = "report.html"
#: The sidecar's ``token_histograms`` keys and the output columns they count.
TOKEN_HISTOGRAM_COLUMNS = {"input": "num_input_tokens", "generated": "num_generated_tokens"}
#: Throughput bucket widths in seconds, the first that gives at most MAX_TIME_BUCKETS wins.
_NICE_SECONDS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
MAX_TIME_BUCKETS = 40


# -- the sidecar fields (written by sink.py, one part at a time) ----------------------------------


def token_count(record: Mapping[str, CellValue], column: str) -> int:
    """A row's token count; 0 when a postprocess dropped or emptied the column."""
    return int(record.get(column) or 0)


def row_tokens(record: Mapping[str, CellValue]) -> tuple[int, int]:
    """(input, generated) tokens of an output row (``TOKEN_HISTOGRAM_COLUMNS``)."""
    return token_count(record, "num_input_tokens"), token_count(record, "num_generated_tokens")


def token_bucket(count: int) -> int:
    """The lower bound of a count's power-of-two bucket: 0, 1, 2, 4, 8, ...; bucket b holds b..2b-1."""
    return 0 if count <= 0 else 1 << (count.bit_length() - 1)


def token_histogram(counts: Iterable[int]) -> dict[str, int]:
    """Counts per power-of-two bucket, keyed by the bucket's lower bound (a string: JSON keys)."""
    buckets = Counter(token_bucket(count) for count in counts)
    return {str(bucket): buckets[bucket] for bucket in sorted(buckets)}


def part_report_fields(
    outputs: list[Row],
    written_at: datetime | None = None,
    tokens_of: Callable[[Mapping[str, CellValue]], tuple[int, int]] = row_tokens,
    token_counts: list[tuple[int, int]] | None = None,
) -> JsonObject:
    """What a part's sidecar carries for the report: ``written_at`` (default: now, UTC, ISO) and
    ``token_histograms`` (``input`` and ``generated``: :func:`token_histogram` of the output rows'
    ``tokens_of``, which reads another output shape, e.g. OpenAI's ``usage``; or ``token_counts``, the
    engine's own, one (in, out) pair per output row)."""
    counts = token_counts if token_counts is not None else [tokens_of(record) for record in outputs]
    return {
        "written_at": (written_at or datetime.now(UTC)).isoformat(timespec="milliseconds"),
        "token_histograms": {
            name: token_histogram(pair[index] for pair in counts)
            for index, name in enumerate(TOKEN_HISTOGRAM_COLUMNS)
        },
    }


# -- folding the sidecars (commit.py) -------------------------------------------------------------


def epoch_seconds(value: JsonValue | datetime) -> float | None:
    """A timestamp as epoch seconds; None when it is missing or unreadable. Naive times are UTC."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    return None


@dataclass
class ReportStats:
    """The sidecars added up for the charts.

    ``histograms`` maps ``input`` / ``generated`` to counts per bucket lower bound; ``timeline`` holds
    one ``(written_at, rows, tokens_out)`` per timed part. Rows of parts without the fields (older
    sidecars) are counted in ``rows_out_without_histograms`` and ``rows_without_time``.
    """

    histograms: dict[str, Counter[int]] = field(
        default_factory=lambda: {name: Counter() for name in TOKEN_HISTOGRAM_COLUMNS}
    )
    timeline: list[tuple[float, int, int]] = field(default_factory=list)
    rows_out_without_histograms: int = 0
    rows_without_time: int = 0

    @classmethod
    def of_sidecars(cls, sidecars: Iterable[Mapping[str, JsonValue]]) -> ReportStats:
        stats = cls()
        for sidecar in sidecars:
            stats.add(sidecar)
        return stats

    def add(self, sidecar: Mapping[str, JsonValue]) -> None:
        rows_out = int(sidecar.get("rows_out") or 0)
        rows = rows_out + int(sidecar.get("rows_failed") or 0)
        histograms = sidecar.get("token_histograms")
        if isinstance(histograms, Mapping) and all(name in histograms for name in TOKEN_HISTOGRAM_COLUMNS):
            for name in TOKEN_HISTOGRAM_COLUMNS:
                self.histograms[name].update({int(bucket): int(n) for bucket, n in histograms[name].items()})
        else:
            self.rows_out_without_histograms += rows_out
        written_at = epoch_seconds(sidecar.get("written_at"))
        if written_at is None:
            self.rows_without_time += rows
        else:
            self.timeline.append((written_at, rows, int(sidecar.get("tokens_out") or 0)))


@dataclass(frozen=True)
class Throughput:
    """Rows and output tokens per time bucket; bucket i starts ``start + i * bucket_seconds``."""

    start: float
    bucket_seconds: int
    rows: list[int]
    tokens_out: list[int]


def throughput(
    timeline: Iterable[tuple[float, int, int]],
    start: float | None = None,
    max_buckets: int = MAX_TIME_BUCKETS,
) -> Throughput | None:
    """Bucket the timed parts from ``start`` (the run's start; earlier parts, staged by an earlier
    try, move it back) to the last part. None without any timed part."""
    events = sorted(timeline)
    if not events:
        return None
    first = events[0][0] if start is None else min(start, events[0][0])
    span = events[-1][0] - first
    width = next((w for w in _NICE_SECONDS if span // w + 1 <= max_buckets), None)
    if width is None:
        width = math.ceil(span / (max_buckets - 1) / 86400) * 86400
    count = int(span // width) + 1
    rows, tokens = [0] * count, [0] * count
    for at, part_rows, part_tokens in events:
        index = min(int((at - first) // width), count - 1)
        rows[index] += part_rows
        tokens[index] += part_tokens
    return Throughput(start=first, bucket_seconds=width, rows=rows, tokens_out=tokens)


# -- the page -------------------------------------------------------------------------------------


#: The phases of a run's ``timings`` block (reporting/timings.py), in the order they happen, as the
#: report's table and the task's log line name them.
PHASE_LABELS = (
    ("job_wall_s", "the job, from its submission (runtime env, driver start and all below)"),
    ("runtime_env_s", "runtime env (submitted to driver started)"),
    ("driver_start_s", "driver start (Python, imports, ray.init)"),
    ("read_and_prepare_s", "read and prepare"),
    ("before_engine_stage_s", "rows ready to engine stage start (bad rows staged, the processor's build)"),
    ("engine_start_to_first_row_s", "engine start to first row"),
    ("engine_import_s", "of which the slowest replica's actor to constructor"),
    ("engine_build_s", "of which the slowest replica's engine build (vLLM import, weights, compile)"),
    ("generating_s", "generating (first to last row staged)"),
    ("engine_stage_end_s", "last row staged to engine stage end"),
    ("commit_s", "commit"),
)


def _e(value: JsonValue) -> str:
    return html.escape(str(value), quote=True)


def _number(value: JsonValue) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else "—"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def _timestamp(value: JsonValue) -> str | None:
    seconds = epoch_seconds(value)
    return None if seconds is None else f"{datetime.fromtimestamp(seconds, UTC):%Y-%m-%d %H:%M:%S} UTC"


def _offset(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    return f"+{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"+{rest // 60}:{rest % 60:02d}"


def _width(seconds: int) -> str:
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def _compact(value: float) -> str:
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.3g}" if value != int(value) else str(int(value))


def _bucket_range(bucket: int) -> str:
    return str(bucket) if bucket < 2 else f"{bucket:,}–{2 * bucket - 1:,}"


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is >= value (the charts' top line)."""
    if value <= 1:
        return 1
    power = 10 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 2.5, 5, 10) if step * power >= value)


def _bar_chart(chart_id: str, bars: list[tuple[str, str, int]], color: str, caption: str) -> str:
    """An inline SVG bar chart of ``(axis label, tooltip, value)``; each bar carries data-value."""
    width, height, left, right, bottom, top = 560, 190, 52, 22, 30, 12
    plot_width, plot_height = width - left - right, height - top - bottom
    peak = _nice_ceiling(max((value for _, _, value in bars), default=0))
    slot = plot_width / max(len(bars), 1)
    every = math.ceil(len(bars) / 12) or 1
    # Presentation attributes rather than page CSS, so a chart reads the same when copied out alone.
    parts = [
        f'<svg id="{_e(chart_id)}" viewBox="0 0 {width} {height}" role="img" aria-label="{_e(caption)}" '
        'font-family="system-ui,sans-serif" font-size="10" fill="#5b6474">',
    ]
    for fraction in (0, 0.5, 1):
        y = top + plot_height * (1 - fraction)
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e2e5ea"/>')
        parts.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_e(_compact(peak * fraction))}</text>'
        )
    for index, (label, tooltip, value) in enumerate(bars):
        bar_height = plot_height * value / peak
        x = left + index * slot + slot * 0.1
        parts.append(
            f'<rect x="{x:.1f}" y="{top + plot_height - bar_height:.1f}" width="{slot * 0.8:.1f}" '
            f'height="{bar_height:.1f}" fill="{color}" data-value="{value}">'
            f"<title>{_e(tooltip)}</title></rect>"
        )
        if index % every == 0:
            label_x, label_y = x + slot * 0.4, height - bottom + 14
            parts.append(f'<text x="{label_x:.1f}" y="{label_y}" text-anchor="middle">{_e(label)}</text>')
    parts.append("</svg>")
    return f"<figure>{''.join(parts)}<figcaption>{_e(caption)}</figcaption></figure>"


def _section(title: str, body: str, note: str = "") -> str:
    """A titled block of the page; ``body`` is markup already, ``note`` is plain text."""
    note_html = f"<p class=note>{_e(note)}</p>" if note else ""
    return f"<section><h2>{_e(title)}</h2>{body}{note_html}</section>"


def _table(headers: tuple[str, ...], rows: Iterable[tuple[CellValue, ...]]) -> str:
    """A table whose first column is text and the others numbers; every cell is escaped."""
    head = "".join(f"<th{' class=num' if i else ''}>{_e(h)}</th>" for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(f"<td{' class=num' if i else ''}>{_e(c)}</td>" for i, c in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _wall_seconds(summary: Mapping[str, JsonValue]) -> JsonValue:
    """The job's wall time as the timing section counts it (``job_wall_s``: submitted to committed,
    runtime env and driver start included) where known, else the driver's own (``wall_seconds``).

    One number for one run: else a report read 51 s at the top and 66 s in "Where the time went"."""
    timings = summary.get("timings")
    job_wall = timings.get("job_wall_s") if isinstance(timings, Mapping) else None
    return job_wall if job_wall is not None else summary.get("wall_seconds")


def _cards(summary: Mapping[str, JsonValue]) -> str:
    cards = [
        ("rows_in", "Rows in", _number(summary.get("rows_in"))),
        ("rows_out", "Rows out", _number(summary.get("rows_out"))),
        ("rows_failed", "Rows failed", _number(summary.get("rows_failed"))),
        ("rows_duplicate", "Duplicate rows", _number(summary.get("rows_duplicate"))),
        ("rows_resumed", "Resumed rows", _number(summary.get("rows_resumed"))),
        ("tokens_in", "Tokens in", _number(summary.get("tokens_in"))),
        ("tokens_out", "Tokens out", _number(summary.get("tokens_out"))),
        ("wall_seconds", "Wall time", _duration(_wall_seconds(summary))),
    ]
    items = "".join(
        f'<div><dt>{_e(label)}</dt><dd id="{key}">{_e(value)}</dd></div>' for key, label, value in cards
    )
    return f'<dl class="cards">{items}</dl>'


def _failed_rows_banner(summary: Mapping[str, JsonValue]) -> str:
    """The failed-row check's message at the top of the page, or nothing when the run passed it."""
    message = summary.get("failed_rows_message")
    if not isinstance(message, str) or not message.strip():
        return ""
    return (
        '<section class=alert id="failed-rows" role="alert"><h2>Too many rows failed</h2>'
        f"<p>{_e(message)}</p></section>"
    )


def _run_facts(summary: Mapping[str, JsonValue]) -> str:
    versions = summary.get("versions") or {}
    facts = [
        ("Model", summary.get("model")),
        ("Output version", summary.get("version")),
        ("Started at", _timestamp(summary.get("started_at"))),
        ("Committed at", _timestamp(summary.get("committed_at"))),
        *((f"{name} version", value) for name, value in sorted(versions.items())),
        ("Input", summary.get("input_uri")),
        ("Outputs", summary.get("outputs_uri")),
        ("Errors", summary.get("errors_uri")),
    ]
    rows = "".join(f"<tr><th>{_e(name)}</th><td>{_e('—' if v is None else v)}</td></tr>" for name, v in facts)
    return f'<table class="facts"><tbody>{rows}</tbody></table>'


def _held_try_section(held: JsonValue) -> str:
    """What the earlier try whose held rows this run committed spent generating them (such a run
    starts no engine: without this its report shows the rows as free)."""
    if not isinstance(held, Mapping):
        return ""
    job = held.get("job_id") or "an earlier try"
    note = (
        f"This run started no engine: it committed the rows that {job} generated and held, once the "
        "failed-row thresholds passed them. The phases above are that try's."
    )
    return _timings_section(held.get("timings"), "What generating these rows took", note) or _section(
        "What generating these rows took", "", note
    )


def _timings_section(timings: JsonValue, title: str = "Where the time went", note: str | None = None) -> str:
    """Where the run's time and GPUs went: each phase, GPU-seconds held, and each engine replica's start."""
    if not isinstance(timings, Mapping):
        return ""
    rows = [
        f"<tr><th>{_e(label)}</th><td class=num>{_duration(seconds)}</td></tr>"
        for key, label in PHASE_LABELS
        if isinstance(seconds := timings.get(key), int | float) and not isinstance(seconds, bool)
    ]
    held = _number_or_none(timings.get("gpu_seconds_held"))
    if held is not None and _number_or_none(timings.get("gpus_per_replica")) == 0:
        replicas = timings.get("replicas")
        rows.append(
            f"<tr><th>GPU-seconds held</th><td class=num>none ({_e(replicas)} "
            f"replica{'' if replicas == 1 else 's'} on CPU)</td></tr>"
        )
    elif held is not None:
        rows.append(
            f"<tr><th>GPU-seconds held</th><td class=num>{held:,.1f} ({_e(timings.get('replicas'))} replicas "
            f"x {_e(timings.get('gpus_per_replica'))} GPU)</td></tr>"
        )
    replica_seconds = _number_or_none(timings.get("replica_seconds_held"))
    if replica_seconds is not None:
        rows.append(f"<tr><th>replica-seconds held</th><td class=num>{replica_seconds:,.1f}</td></tr>")
    kept_warm = _number_or_none(timings.get("keep_warm_gpu_seconds_max"))
    kept_warm_replicas = _number_or_none(timings.get("keep_warm_replica_seconds_max"))
    if kept_warm == 0 and kept_warm_replicas is not None:  # a CPU engine: "0.0 GPU-seconds" said nothing
        rows.append(
            "<tr><th>replica-seconds the warm pool may hold idle after this job (at most; the pool's, "
            f"not counted above)</th><td class=num>{kept_warm_replicas:,.1f}</td></tr>"
        )
    elif kept_warm is not None:
        rows.append(
            "<tr><th>GPU-seconds the warm pool may hold idle after this job (at most; the pool's, not "
            f"counted above)</th><td class=num>{kept_warm:,.1f}</td></tr>"
        )
    replicas = [phase for phase in timings.get("engine_replicas") or [] if isinstance(phase, Mapping)]
    columns = ("actor_start_s", "import_s", "engine_build_s", "first_row_s")
    replica_rows = "".join(
        f"<tr><td>{_e(phase.get('replica'))}</td>"
        + "".join(f"<td class=num>{_duration(phase.get(key))}</td>" for key in columns)
        + "</tr>"
        for phase in replicas
    )
    replica_table = (
        "<table><thead><tr><th>engine replica</th><th class=num>stage start to actor up</th>"
        "<th class=num>to constructor</th><th class=num>engine build</th><th class=num>to first row</th>"
        f"</tr></thead><tbody>{replica_rows}</tbody></table>"
        if replicas
        else ""
    )
    if not rows and not replica_table:
        return ""
    note = note or (
        "One after the other, the phases from the runtime env to the commit make up the job's time; the "
        "engine replicas' own start-up (the rows marked 'of which') may have begun beside the reads. This "
        "page is written during the commit: the job's time runs to it, and the manifest's timings block "
        "has the commit's own time and the job's to its end."
    )
    body = f'<table class="facts"><tbody>{"".join(rows)}</tbody></table>{replica_table}'
    return _section(title, body, note)


def _pool_section(pool: JsonValue) -> str:
    """The warm pool the engine stage ran on (the manifest's ``engine_pool``): which replicas were warm,
    and when each replica's engine was built, so that a warm run and a cold one tell themselves apart."""
    if not isinstance(pool, Mapping):
        return ""
    facts = [
        ("Pool", pool.get("fingerprint")),
        (
            "Replicas warm when the job started",
            f"{_number(pool.get('warm_replicas'))} of {_number(pool.get('replicas'))}",
        ),
        ("Kept warm after the last job", _duration(_number_or_none(pool.get("keep_warm_seconds")))),
    ]
    rows = "".join(f"<tr><th>{_e(name)}</th><td>{_e('—' if v is None else v)}</td></tr>" for name, v in facts)
    replicas = [entry for entry in pool.get("replica_timings") or [] if isinstance(entry, Mapping)]
    replica_rows = "".join(
        f"<tr><td>{_e(entry.get('replica'))}</td>"
        + "".join(
            f"<td class=num>{_e(_signed(entry.get(key)))}</td>"
            for key in ("engine_start_s", "engine_ready_s")
        )
        + f"<td class=num>{_build_cell(entry)}</td>"
        + f"<td class=num>{_e(_number(entry.get('rows')))}</td></tr>"
        for entry in replicas
    )
    table = (
        "<table><thead><tr><th>replica</th><th class=num>engine start</th><th class=num>engine ready</th>"
        "<th class=num>engine build</th><th class=num>rows it answered</th></tr></thead>"
        f"<tbody>{replica_rows}</tbody></table>"
        if replicas
        else ""
    )
    note = (
        "Start and ready count from when this job asked for its replicas: a negative time is a replica "
        "an earlier job built (warm)."
    )
    return _section("Warm engine pool", f'<table class="facts"><tbody>{rows}</tbody></table>{table}', note)


def _build_cell(entry: Mapping[str, JsonValue]) -> str:
    """A replica's engine build time; one still building when the job ended took none of its rows."""
    if entry.get("building_at_job_end") is True:
        return "still building when the job ended (took none of its rows)"
    return _duration(_number_or_none(entry.get("engine_build_seconds")))


def _number_or_none(value: JsonValue) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _signed(seconds: JsonValue) -> str:
    number = _number_or_none(seconds)
    return "—" if number is None else f"{number:+,.1f} s"


def _counts_table(column: str, counts: Mapping[str, int], total: int | None, of: str) -> str:
    """Row counts by name (error kinds, labels: user data), their share of ``total``, and bars
    scaled to the largest count."""
    denominator = total or sum(counts.values()) or 1
    largest = max(counts.values(), default=0) or 1
    rows = []
    for name, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        share = 100 * count / denominator
        bar = f'<span class=bar style="width:{100 * count / largest:.1f}%"></span>'
        rows.append(
            f"<tr><td>{_e(name)}</td><td class=num>{count:,}</td><td class=num>{share:.1f}%</td>"
            f"<td class=barcell>{bar}</td></tr>"
        )
    head = (
        f"<tr><th>{_e(column)}</th><th class=num>rows</th><th class=num>share of {_e(of)}</th><th></th></tr>"
    )
    return f"<table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"


def _histogram_figure(name: str, histogram: Counter[int], title: str, color: str) -> str:
    present = [bucket for bucket, count in histogram.items() if count]
    if not present:
        return f"<figure><p class=note>{_e(title)}: no output rows to show.</p></figure>"
    low, high = min(present), max(present)
    buckets = [0] if low == 0 else []
    bucket = max(low, 1)
    while bucket <= high:  # every bucket in between, empty ones too, so the shape reads true
        buckets.append(bucket)
        bucket *= 2
    bars = [(str(b), f"{_bucket_range(b)} tokens: {histogram[b]:,} rows", histogram[b]) for b in buckets]
    total = sum(histogram.values())
    figure = _bar_chart(f"hist-{name}", bars, color, f"{title}: output rows per bucket ({total:,} rows)")
    table = _table(("tokens", "rows"), ((_bucket_range(b), f"{histogram[b]:,}") for b in buckets))
    return f"<div>{figure}<details><summary>numbers</summary>{table}</details></div>"


def _histograms_section(stats: ReportStats) -> str:
    figures = [
        _histogram_figure("input", stats.histograms["input"], "Input tokens per output row", "#4c78a8"),
        _histogram_figure(
            "generated", stats.histograms["generated"], "Generated tokens per output row", "#f58518"
        ),
    ]
    note = "Buckets are powers of two: bucket b holds b to 2b − 1 tokens."
    if stats.rows_out_without_histograms:
        note += (
            f" {stats.rows_out_without_histograms:,} output rows are not shown: their parts were staged"
            " before token histograms were recorded."
        )
    return _section("Token lengths", f"<div class=pair>{''.join(figures)}</div>", note)


def _throughput_section(stats: ReportStats, start: float | None) -> str:
    buckets = throughput(stats.timeline, start)
    if buckets is None:
        return _section(
            "Throughput", "", "No part recorded when it was staged (parts staged by an older version)."
        )
    labels = [_offset(i * buckets.bucket_seconds) for i in range(len(buckets.rows))]
    per = f"per {_width(buckets.bucket_seconds)}"
    rows = [(label, f"{label}: {n:,} rows", n) for label, n in zip(labels, buckets.rows, strict=True)]
    tokens = [
        (label, f"{label}: {n:,} output tokens", n)
        for label, n in zip(labels, buckets.tokens_out, strict=True)
    ]
    figures = [
        _bar_chart("throughput-rows", rows, "#54a24b", f"Rows settled {per} (outputs and errors)"),
        _bar_chart("throughput-tokens", tokens, "#b279a2", f"Output tokens {per}"),
    ]
    note = f"Time since {_timestamp(buckets.start)}; a part's rows count at the moment the part was staged."
    if stats.rows_without_time:
        note += f" {stats.rows_without_time:,} rows are not shown: their parts did not record a time."
    return _section("Throughput", f"<div class=pair>{''.join(figures)}</div>", note)


_STYLE = """
body{margin:0;background:#f6f7f9;color:#1d2330;
  font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
main{max-width:1180px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:0 0 12px}
.sub,.note,figcaption{color:#5b6474;font-size:12.5px}
section{background:#fff;border:1px solid #e2e5ea;border-radius:8px;padding:16px 18px;margin:16px 0}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:16px 0}
.cards div{flex:1 1 100px;background:#fff;border:1px solid #e2e5ea;border-radius:8px;padding:10px 12px}
.cards dt{color:#5b6474;font-size:12px}.cards dd{margin:2px 0 0;font-size:20px;font-weight:600}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid #eef0f3}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.facts th{width:170px;color:#5b6474;font-weight:500}.facts td{word-break:break-all}
.barcell{width:35%}.bar{display:block;height:10px;background:#e45756;border-radius:2px}
.pair{display:flex;flex-wrap:wrap;gap:16px}.pair>*{flex:1 1 420px;min-width:0}
figure{margin:0}svg{width:100%;height:auto}
details{margin-top:6px;font-size:12.5px}summary{cursor:pointer;color:#5b6474}
.alert{background:#fdecec;border-color:#e45756;color:#7a1d1d}.alert h2{color:#b42318}.alert p{margin:0}
"""


def render_report(summary: Mapping[str, JsonValue], stats: ReportStats) -> str:
    """The report page.

    :param summary: the run's facts under the manifest's keys (``model``, ``version``, ``rows_in``,
        ``rows_out``, ``rows_failed``, ``rows_duplicate``, ``rows_resumed``, ``tokens_in``,
        ``tokens_out``, ``wall_seconds``, ``started_at``, ``committed_at``, ``versions``,
        ``errors_by_reason``, ``generated_text_counts``, ``timings``, ``engine_pool``, the URIs); a
        missing one shows as "—".
        ``failed_rows_message`` (the failed-row check's message, or None when the run passed it) shows
        as a banner above everything else.
    :param stats: the sidecars added up (:class:`ReportStats`).
    """
    subject = " · ".join(str(summary[key]) for key in ("model", "version") if summary.get(key))
    rows_in, rows_out = (
        summary.get(key) if isinstance(summary.get(key), int) else None for key in ("rows_in", "rows_out")
    )
    errors = summary.get("errors_by_reason") or {}
    sections = [
        f"<header><h1>Batch inference run report</h1><p class=sub>{_e(subject)}</p></header>",
        _failed_rows_banner(summary),
        _cards(summary),
        _section("Run", _run_facts(summary)),
        _section(
            "Errors by reason",
            _counts_table("kind", errors, rows_in, "rows in") if errors else "",
            "" if errors else "No failed rows.",
        ),
        _timings_section(summary.get("timings")),
        _pool_section(summary.get("engine_pool")),
        _held_try_section(summary.get("held_try")),
        _histograms_section(stats),
        _throughput_section(stats, epoch_seconds(summary.get("started_at"))),
    ]
    labels = summary.get("generated_text_counts")
    if labels:
        sections.append(_section("Generated labels", _counts_table("label", labels, rows_out, "rows out")))
    footer = "<p class=note>Written at commit by airflow-provider-raybatch; this page loads nothing else.</p>"
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{_e(f'Run report · {subject}' if subject else 'Run report')}</title>"
        f"<style>{_STYLE}</style></head>\n<body><main>\n"
        + "\n".join(filter(None, sections))
        + f"\n{footer}\n</main></body></html>\n"
    )
