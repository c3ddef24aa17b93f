"""Tests of airflow_provider_raybatch/manifest.py: the manifest's hand-over through the driver log."""

from __future__ import annotations

import json

from airflow_provider_raybatch.manifest import MANIFEST_LOG_MARKER, manifest_from_log, manifest_log_line

MANIFEST = {"output_uri": "s3://b/out", "rows_in": 3, "rows_out": 2, "rows_failed": 1, "note": "héllo"}


def test_log_line_is_one_marked_line_of_sorted_compact_json() -> None:
    line = manifest_log_line(MANIFEST)

    assert line.startswith(MANIFEST_LOG_MARKER)
    assert "\n" not in line
    payload = line.removeprefix(MANIFEST_LOG_MARKER)
    assert json.loads(payload) == MANIFEST
    assert payload == json.dumps(MANIFEST, sort_keys=True, separators=(",", ":"))


def test_round_trip_through_a_log_with_other_lines() -> None:
    log = "\n".join(["starting", "INFO pipeline: " + manifest_log_line(MANIFEST), "done", ""])

    assert manifest_from_log(log) == MANIFEST


def test_the_last_manifest_wins() -> None:
    earlier = {**MANIFEST, "rows_out": 0}
    log = manifest_log_line(earlier) + "\nretrying\n" + manifest_log_line(MANIFEST) + "\n"

    assert manifest_from_log(log) == MANIFEST


def test_no_manifest_gives_none() -> None:
    assert manifest_from_log("") is None
    assert manifest_from_log("line one\nRAYBATCH_MANIFEST\nline three") is None
