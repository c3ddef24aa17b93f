"""Tests of airflow_provider_raybatch/pipeline/reporting/report.py: the sidecar fields, their sums,
and the page.

The last test stages a part with the ``PartWriter`` a job stages with, so the sidecar checked is the
one a job writes.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_raybatch.pipeline.reporting import report
from airflow_provider_raybatch.pipeline.reporting.report import ReportStats, render_report, throughput
from airflow_provider_raybatch.pipeline.stage.parts import PartWriter

T0 = datetime(2026, 11, 21, 8, 0, tzinfo=UTC)


def output_row(tokens_in: Any, tokens_out: Any) -> dict[str, Any]:  # Any: row values as a job writes them.
    return {
        "row_id": "in.jsonl:1",
        "generated_text": "x",
        "num_input_tokens": tokens_in,
        "num_generated_tokens": tokens_out,
    }


def sidecar(
    rows_out: int,
    rows_failed: int = 0,
    *,
    tokens_out: int = 0,
    at: datetime | None = None,
    histograms: dict[str, dict[str, int]] | None = None,
) -> dict[str, Any]:
    """A sidecar as the part writer writes it; without ``at`` and ``histograms``, one from before the
    report."""
    document: dict[str, Any] = {  # Any: JSON values.
        "sources": [f"in.jsonl:{i}" for i in range(rows_out + rows_failed)],
        "files": {},
        "rows_out": rows_out,
        "rows_failed": rows_failed,
        "tokens_in": 0,
        "tokens_out": tokens_out,
        "errors_by_reason": {"empty prompt": rows_failed} if rows_failed else {},
    }
    if at is not None:
        document["written_at"] = at.isoformat(timespec="milliseconds")
    if histograms is not None:
        document["token_histograms"] = histograms
    return document


def data_values(page: str, chart_id: str) -> list[int]:
    """The bar values of one chart of the page."""
    match = re.search(rf'<svg id="{chart_id}".*?</svg>', page, re.S)
    assert match, f"no chart {chart_id}"
    return [int(value) for value in re.findall(r'data-value="(\d+)"', match.group(0))]


# -- the sidecar fields ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "bucket"),
    [(-3, 0), (0, 0), (1, 1), (2, 2), (3, 2), (4, 4), (7, 4), (8, 8), (1000, 512), (1023, 512), (1024, 1024)],
)
def test_token_bucket(count: int, bucket: int) -> None:
    assert report.token_bucket(count) == bucket


def test_token_histogram_counts_per_power_of_two_sorted_by_bucket() -> None:
    histogram = report.token_histogram([0, 1, 2, 3, 4, 7, 8, 1000, 600, 3])

    assert histogram == {"0": 1, "1": 1, "2": 3, "4": 2, "8": 1, "512": 2}
    assert list(histogram) == ["0", "1", "2", "4", "8", "512"]  # numeric order, not text order
    assert report.token_histogram([]) == {}


def test_part_report_fields_histograms_add_up_to_the_output_rows() -> None:
    outputs = [output_row(17, 3), output_row(40, 3), output_row(33, 12), output_row(None, 0)]
    outputs.append({"row_id": "x"})  # a postprocess dropped the token columns: counted as 0, not lost

    fields = report.part_report_fields(outputs, written_at=T0)

    assert fields == {
        "written_at": "2026-11-21T08:00:00.000+00:00",
        "token_histograms": {
            "input": {"0": 2, "16": 1, "32": 2},
            "generated": {"0": 2, "2": 2, "8": 1},
        },
    }
    assert all(sum(h.values()) == len(outputs) for h in fields["token_histograms"].values())
    assert report.epoch_seconds(fields["written_at"]) == T0.timestamp()


def test_part_report_fields_stay_small_however_many_rows() -> None:
    outputs = [output_row(n % 3000, n % 200) for n in range(20_000)]

    fields = report.part_report_fields(outputs)

    assert len(json.dumps(fields)) < 400
    assert sum(fields["token_histograms"]["input"].values()) == 20_000
    assert abs(report.epoch_seconds(fields["written_at"]) - datetime.now(UTC).timestamp()) < 60


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("2026-11-21T08:00:00+00:00", T0.timestamp()),
        ("2026-11-21T08:00:00", T0.timestamp()),  # naive: UTC
        ("2026-11-21T09:00:00.000+01:00", T0.timestamp()),
        (T0.timestamp(), T0.timestamp()),
        (int(T0.timestamp()), T0.timestamp()),
        (T0, T0.timestamp()),
        (None, None),
        ("yesterday", None),
        (True, None),
        ([1], None),
    ],
)
def test_epoch_seconds(value: Any, seconds: float | None) -> None:  # Any: what a sidecar might hold.
    assert report.epoch_seconds(value) == seconds


# -- adding up the sidecars --------------------------------------------------------------------------


def test_report_stats_add_up_new_and_old_sidecars() -> None:
    new = [
        sidecar(
            3,
            1,
            tokens_out=9,
            at=T0 + timedelta(seconds=5),
            histograms={"input": {"16": 2, "32": 1}, "generated": {"2": 3}},
        ),
        sidecar(
            2,
            0,
            tokens_out=4,
            at=T0 + timedelta(seconds=1),
            histograms={"input": {"16": 2}, "generated": {"2": 1, "4": 1}},
        ),
    ]
    old = [sidecar(5, 2, tokens_out=10)]

    stats = ReportStats.of_sidecars([*new, *old])

    assert stats.histograms["input"] == Counter({16: 4, 32: 1})
    assert stats.histograms["generated"] == Counter({2: 4, 4: 1})
    assert all(sum(h.values()) == 3 + 2 for h in stats.histograms.values())
    assert stats.rows_out_without_histograms == 5
    assert sorted(stats.timeline) == [(T0.timestamp() + 1, 2, 4), (T0.timestamp() + 5, 4, 9)]
    assert stats.rows_without_time == 7


def test_report_stats_of_no_sidecars_is_empty() -> None:
    stats = ReportStats.of_sidecars([])

    assert (stats.timeline, stats.rows_out_without_histograms, stats.rows_without_time) == ([], 0, 0)
    assert all(not h for h in stats.histograms.values())


# -- throughput ------------------------------------------------------------------------------------


def test_throughput_buckets_add_up_to_the_rows_and_tokens() -> None:
    start = T0.timestamp()
    timeline = [(start + 7 * i, 10 + i, 100 + i) for i in range(50)]  # 50 parts over 343 s

    buckets = throughput(timeline, start)

    assert buckets is not None
    assert buckets.bucket_seconds == 10  # 343 s at 5 s a bucket would be 69 buckets: too many
    assert len(buckets.rows) == len(buckets.tokens_out) == 35
    assert sum(buckets.rows) == sum(rows for _, rows, _ in timeline)
    assert sum(buckets.tokens_out) == sum(tokens for _, _, tokens in timeline)
    assert buckets.rows[0] == 10 + 11  # parts at 0 s and 7 s
    assert buckets.start == start


def test_throughput_starts_at_the_run_start_or_an_earlier_part() -> None:
    start = T0.timestamp()

    later = throughput([(start + 30, 5, 1), (start + 31, 5, 1)], start)
    resumed = throughput([(start - 100, 5, 1), (start + 20, 5, 1)], start)  # a part of an earlier try

    assert later is not None and later.start == start and later.bucket_seconds == 1
    assert later.rows[:30] == [0] * 30 and later.rows[30:] == [5, 5]
    assert resumed is not None and resumed.start == start - 100
    assert (resumed.rows[0], resumed.rows[-1], sum(resumed.rows)) == (5, 5, 10)


@pytest.mark.parametrize("span", [0, 1, 59, 3600, 86_400 * 3, 86_400 * 400])
def test_throughput_never_makes_more_buckets_than_allowed(span: int) -> None:
    start = T0.timestamp()

    buckets = throughput([(start, 1, 2), (start + span, 3, 4)], start)

    assert buckets is not None
    assert 1 <= len(buckets.rows) <= report.MAX_TIME_BUCKETS
    assert (sum(buckets.rows), sum(buckets.tokens_out)) == (4, 6)
    assert buckets.rows[-1] == 3 + (1 if span == 0 else 0)


def test_throughput_of_no_timed_part_is_none() -> None:
    assert throughput([], T0.timestamp()) is None


# -- the page ----------------------------------------------------------------------------------------


SUMMARY: dict[str, Any] = {  # Any: manifest-shaped values.
    "model": "Qwen/Qwen2.5-1.5B-Instruct",
    "version": "20261121T080500-0123456789ab-c0ffee",
    "input_uri": "s3://bucket/customers/2026-11-21/customers.csv",
    "rows_in": 1234,
    "rows_out": 1200,
    "rows_failed": 34,
    "rows_duplicate": 4,
    "rows_resumed": 96,
    "tokens_in": 56_789,
    "tokens_out": 4321,
    "wall_seconds": 754.2,
    "started_at": T0.isoformat(),
    "committed_at": (T0 + timedelta(seconds=754)).isoformat(),
    "versions": {"ray": "2.60.0", "vllm": "0.32.0"},
    "errors_by_reason": {"duplicate id": 4, "empty prompt": 20, "<script>alert('x')</script>": 10},
}


def stats_of_run() -> ReportStats:
    """1,200 output rows and 1,234 rows in timed parts: the SUMMARY's run."""
    parts = []
    for i in range(12):
        outputs = [output_row(20 + 7 * n + i, 1 + n % 5) for n in range(100)]
        part = sidecar(100, 3 if i < 10 else 2, tokens_out=360, at=T0 + timedelta(seconds=60 * i + 30))
        part.update(report.part_report_fields(outputs, written_at=T0 + timedelta(seconds=60 * i + 30)))
        parts.append(part)
    return ReportStats.of_sidecars(parts)


def test_the_wall_time_at_the_top_is_the_jobs_as_where_the_time_went_counts_it() -> None:
    """'Wall time' read the driver's 51 s, the timing section the job's 66 s."""
    timed = {**SUMMARY, "timings": {"job_wall_s": 800.0, "read_and_prepare_s": 3.0}}

    assert '<dd id="wall_seconds">13m 20s</dd>' in render_report(timed, stats_of_run())
    assert '<dd id="wall_seconds">12m 34s</dd>' in render_report(SUMMARY, stats_of_run())  # no timings


def test_report_shows_the_counts() -> None:
    page = render_report(SUMMARY, stats_of_run())

    for key, shown in [
        ("rows_in", "1,234"),
        ("rows_out", "1,200"),
        ("rows_failed", "34"),
        ("rows_duplicate", "4"),
        ("rows_resumed", "96"),
        ("tokens_in", "56,789"),
        ("tokens_out", "4,321"),
        ("wall_seconds", "12m 34s"),
    ]:
        assert f'<dd id="{key}">{shown}</dd>' in page
    for text in [
        "Qwen/Qwen2.5-1.5B-Instruct",
        SUMMARY["version"],
        "2.60.0",
        "0.32.0",
        "2026-11-21 08:00:00 UTC",
    ]:
        assert text in page


def test_report_escapes_every_error_reason_and_the_model() -> None:
    summary = {
        **SUMMARY,
        "model": 'm"><img src=x onerror=alert(1)>&',
        "errors_by_reason": {
            "<script>alert('x')</script>": 10,
            "a & b": 3,
            '"quoted" <b>': 1,
        },
    }

    page = render_report(summary, stats_of_run())

    assert "<script" not in page
    assert "<img" not in page and "<b>" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "a &amp; b" in page and "&quot;quoted&quot; &lt;b&gt;" in page
    assert "m&quot;&gt;&lt;img src=x onerror=alert(1)&gt;&amp;" in page
    rows = re.findall(r"<tr><td>([^<]*)</td><td class=num>([\d,]+)</td>", page.split("Errors by reason")[1])
    assert rows[:3] == [
        ("&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;", "10"),
        ("a &amp; b", "3"),
        ("&quot;quoted&quot; &lt;b&gt;", "1"),
    ]


def test_report_escapes_generated_labels() -> None:
    page = render_report(
        {**SUMMARY, "generated_text_counts": {"<i>Law</i>": 700, "Other": 500}}, stats_of_run()
    )

    assert "<i>" not in page
    assert "&lt;i&gt;Law&lt;/i&gt;" in page


def test_report_histograms_add_up_to_rows_out() -> None:
    stats = stats_of_run()

    page = render_report(SUMMARY, stats)

    assert sum(data_values(page, "hist-input")) == SUMMARY["rows_out"]
    assert sum(data_values(page, "hist-generated")) == SUMMARY["rows_out"]
    # Every bucket from the lowest to the highest is drawn: 16, 32, ..., 512 for 20 .. 724 tokens.
    assert len(data_values(page, "hist-input")) == 6
    assert data_values(page, "hist-generated") == [240, 480, 480]  # buckets 1, 2 (2-3), 4 (4-5)


def test_report_histograms_keep_rows_without_token_counts() -> None:
    """Rows whose postprocess dropped the token columns sit in bucket 0, drawn before bucket 1."""
    histograms = {"input": {"0": 2, "8": 3}, "generated": {"0": 5}}
    stats = ReportStats.of_sidecars([sidecar(5, at=T0, histograms=histograms)])

    page = render_report({"rows_in": 5, "rows_out": 5}, stats)

    assert data_values(page, "hist-input") == [2, 0, 0, 0, 3]  # buckets 0, 1, 2, 4, 8
    assert data_values(page, "hist-generated") == [5]


def test_report_throughput_adds_up_to_the_rows() -> None:
    page = render_report(SUMMARY, stats_of_run())

    assert sum(data_values(page, "throughput-rows")) == SUMMARY["rows_in"]
    assert sum(data_values(page, "throughput-tokens")) == 12 * 360
    assert "per 30 s" in page


def test_report_loads_nothing_from_elsewhere() -> None:
    page = render_report({**SUMMARY, "generated_text_counts": {"x": 1}}, stats_of_run())

    assert page.startswith("<!doctype html>")
    for reference in ("<script", "<link", "src=", "href=", "@import", "url(", "http://", "https://"):
        assert reference not in page, reference


def test_report_of_old_sidecars_only_says_what_it_cannot_show() -> None:
    stats = ReportStats.of_sidecars([sidecar(5, 1), sidecar(4, 0)])

    page = render_report({"rows_in": 10, "rows_out": 9, "rows_failed": 1}, stats)

    assert '<dd id="rows_in">10</dd>' in page
    assert '<dd id="rows_resumed">—</dd>' in page and '<dd id="wall_seconds">—</dd>' in page
    assert "9 output rows are not shown" in page
    assert "No part recorded when it was staged" in page
    assert "<svg" not in page
    assert "No failed rows." in page  # no errors_by_reason given


def test_report_of_no_rows() -> None:
    page = render_report(
        {"rows_in": 0, "rows_out": 0, "rows_failed": 0, "errors_by_reason": {}}, ReportStats()
    )

    assert '<dd id="rows_in">0</dd>' in page
    assert "no output rows to show" in page


FAILED_ROWS_MESSAGE = (
    "30 of 1,234 rows failed (2.4%, duplicate ids not counted), over max_failed_rows=10. "
    "Most common reasons: 'empty prompt' 20; '<script>alert(1)</script>' 10."
)


def test_report_shows_the_failed_rows_message_first_and_escaped() -> None:
    page = render_report({**SUMMARY, "failed_rows_message": FAILED_ROWS_MESSAGE}, stats_of_run())

    banner = re.search(r'<section class=alert id="failed-rows" role="alert">(.*?)</section>', page, re.S)
    assert banner, "no failed-rows banner"
    shown = banner.group(1)
    assert "Too many rows failed" in shown
    assert "30 of 1,234 rows failed (2.4%, duplicate ids not counted), over max_failed_rows=10." in shown
    assert "&#x27;&lt;script&gt;alert(1)&lt;/script&gt;&#x27; 10." in shown
    assert "<script" not in page
    # At the top: right after the title, before the counts and everything else.
    assert page.index("</header>") < banner.start() < page.index('<dl class="cards">')


@pytest.mark.parametrize("message", [None, "", "  "])
def test_report_of_a_run_that_passed_the_failed_rows_check_has_no_banner(message: str | None) -> None:
    page = render_report({**SUMMARY, "failed_rows_message": message}, stats_of_run())

    assert 'id="failed-rows"' not in page and "Too many rows failed" not in page
    assert render_report(SUMMARY, stats_of_run()) == page  # the key absent: the same page


# -- the part writer writes the fields ----------------------------------------------------------------------


def test_a_staged_parts_sidecar_carries_the_report_fields(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    writer = PartWriter(str(staging), "jsonl", count_labels=False)
    outputs = [output_row(n, 1 + n % 3) for n in (5, 9, 40, 300)]
    error = {"id": "e", "source": "in.jsonl:9", "error": "<script>: no", "input": "{}"}
    rows = [{"source": f"in.jsonl:{i}", "ok": True, "record": json.dumps(r)} for i, r in enumerate(outputs)]
    rows.append({"source": "in.jsonl:9", "ok": False, "record": json.dumps(error)})
    before = datetime.now(UTC).timestamp()

    writer.write_part(rows)

    (path,) = (staging / "parts").iterdir()
    document = json.loads(path.read_text())
    assert document["token_histograms"] == {
        "input": {"4": 1, "8": 1, "32": 1, "256": 1},
        "generated": {"1": 2, "2": 2},
    }
    assert sum(document["token_histograms"]["input"].values()) == document["rows_out"] == 4
    assert before - 1 <= report.epoch_seconds(document["written_at"]) <= datetime.now(UTC).timestamp() + 1
    assert (document["tokens_in"], document["tokens_out"]) == (354, 7)
    assert document["errors_by_reason"] == {"<script>": 1}


def test_report_shows_where_the_time_and_gpus_went() -> None:
    timings = {
        "job_wall_s": 98.5,
        "runtime_env_s": 3.25,
        "driver_start_s": 4.0,
        "read_and_prepare_s": 12.0,
        "engine_start_to_first_row_s": 32.0,
        "engine_import_s": 1.0,
        "engine_build_s": 29.0,
        "generating_s": 54.0,
        "commit_s": None,
        "replicas": 2,
        "gpus_per_replica": 1.0,
        "gpu_seconds_held": 174.0,
        "replica_seconds_held": 174.0,
        "keep_warm_gpu_seconds_max": 1200.0,
        "engine_replicas": [
            {
                "replica": "<b>r1</b>",
                "actor_start_s": 5.0,
                "import_s": 1.0,
                "engine_build_s": 29.0,
                "first_row_s": 2.0,
            },
        ],
    }

    page = render_report({**SUMMARY, "timings": timings}, stats_of_run())

    section = page.split("Where the time went")[1].split("</section>")[0]
    for label, shown in [
        ("the job, from its submission (runtime env, driver start and all below)", "1m 38s"),
        ("runtime env (submitted to driver started)", "3.2 s"),
        ("read and prepare", "12.0 s"),
        ("of which the slowest replica&#x27;s engine build (vLLM import, weights, compile)", "29.0 s"),
        ("generating (first to last row staged)", "54.0 s"),
    ]:
        assert f"<tr><th>{label}</th><td class=num>{shown}</td></tr>" in section
    assert "<th>commit</th>" not in section  # after the page: the manifest has it
    assert "174.0 (2 replicas x 1.0 GPU)" in section
    assert "<tr><th>replica-seconds held</th><td class=num>174.0</td></tr>" in section
    assert (
        "idle after this job (at most; the pool's, not counted above)</th><td class=num>1,200.0<" in section
    )
    assert "One after the other, the phases from the runtime env to the commit make up the job" in page
    assert "&lt;b&gt;r1&lt;/b&gt;" in section and "<b>" not in section


@pytest.mark.parametrize("timings", [None, "12 s", [], {}, {"engine_replicas": "x"}, {"generating_s": True}])
def test_report_of_a_run_without_timings_has_no_such_section(timings: object) -> None:
    page = render_report({**SUMMARY, "timings": timings}, stats_of_run())

    assert "Where the time went" not in page


def test_report_of_a_run_on_a_warm_pool_says_which_replicas_were_warm_and_when_each_was_built() -> None:
    pool = {
        "fingerprint": "<i>0e15a3f1</i>",
        "replicas": 2,
        "warm_replicas": 1,
        "keep_warm_seconds": 600.0,
        "replica_timings": [
            {
                "replica": 0,
                "answered": True,
                "engine_build_seconds": 21.7,
                "engine_start_s": -53.104,
                "engine_ready_s": -31.378,
                "rows": 1450,
            },
            {
                "replica": 1,
                "answered": True,
                "engine_build_seconds": 28.6,
                "engine_start_s": 0.4,
                "engine_ready_s": 29.0,
            },
        ],
    }

    page = render_report({**SUMMARY, "engine_pool": pool}, stats_of_run())

    section = page.split("Warm engine pool")[1].split("</section>")[0]
    assert "<tr><th>Replicas warm when the job started</th><td>1 of 2</td></tr>" in section
    assert "&lt;i&gt;0e15a3f1&lt;/i&gt;" in section and "<i>" not in section
    assert (
        "<td>0</td><td class=num>-53.1 s</td><td class=num>-31.4 s</td><td class=num>21.7 s</td>"
        "<td class=num>1,450</td>"
    ) in section
    # A manifest from before rows were counted per replica (or one that could not say): a dash.
    assert (
        "<td>1</td><td class=num>+0.4 s</td><td class=num>+29.0 s</td><td class=num>28.6 s</td>"
        "<td class=num>—</td>" in section
    )
    assert "a negative time is a replica an earlier job built" in section


def test_report_says_a_replica_still_building_when_the_job_ended_took_none_of_its_rows() -> None:
    pool = {
        "fingerprint": "0e15a3f1",
        "replicas": 2,
        "warm_replicas": 1,
        "keep_warm_seconds": 600.0,
        "replica_timings": [
            {
                "replica": 0,
                "answered": True,
                "engine_build_seconds": 21.7,
                "engine_start_s": -53.104,
                "engine_ready_s": -31.378,
            },
            {"replica": 1, "answered": False, "building_at_job_end": True, "rows": 0},
        ],
    }

    section = render_report({**SUMMARY, "engine_pool": pool}, stats_of_run()).split("Warm engine pool")[1]

    assert (
        "<td>1</td><td class=num>—</td><td class=num>—</td>"
        "<td class=num>still building when the job ended (took none of its rows)</td><td class=num>0</td>"
    ) in section


@pytest.mark.parametrize(
    "pool",
    [None, "warm", [], {"replica_timings": "x"}, {"keep_warm_seconds": "600", "replica_timings": [{}]}],
)
def test_report_of_a_run_on_its_own_engines_has_no_pool_section(pool: object) -> None:
    page = render_report({**SUMMARY, "engine_pool": pool}, stats_of_run())

    assert ("Warm engine pool" in page) is isinstance(pool, dict)


def test_a_cpu_pool_shows_the_replica_seconds_it_may_hold_idle() -> None:
    """On a CPU engine the line read "0.0" while a replica (3 GiB) stayed up 600 s."""
    timings = {
        "replicas": 1,
        "gpus_per_replica": 0.0,
        "gpu_seconds_held": 0.0,
        "replica_seconds_held": 20.0,
        "keep_warm_gpu_seconds_max": 0.0,
        "keep_warm_replica_seconds_max": 600.0,
    }

    page = render_report({**SUMMARY, "timings": timings}, stats_of_run())

    assert "replica-seconds the warm pool may hold idle after this job" in page and "600.0" in page
    assert "GPU-seconds the warm pool may hold idle" not in page
