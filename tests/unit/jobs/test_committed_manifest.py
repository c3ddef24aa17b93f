"""Tests of airflow_provider_raybatch/jobs/committed_manifest.py: reading a committed manifest from
Airflow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_raybatch.jobs import committed_manifest
from airflow_provider_raybatch.jobs.committed_manifest import is_result_of, read_committed_manifest

GOOD = {"status": "complete", "output_uri": "x", "rows_in": 1, "rows_out": 1, "rows_failed": 0}


def test_reads_a_committed_manifest(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps(GOOD))

    assert read_committed_manifest(str(tmp_path)).manifest == GOOD
    assert read_committed_manifest(f"file://{tmp_path}/").manifest == GOOD


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (None, "does not exist"),
        (b"\xff\xfe not text", "not JSON"),
        (b"{truncated", "not JSON"),
        (b"[1, 2]", "not a run manifest"),
        (json.dumps({"status": "complete"}).encode(), "not a run manifest"),
    ],
)
def test_anything_else_is_a_reason_never_an_exception(
    tmp_path: Path, content: bytes | None, why: str
) -> None:
    if content is not None:
        (tmp_path / "manifest.json").write_bytes(content)

    found = read_committed_manifest(str(tmp_path))

    assert found.manifest is None and why in found.why_not


def test_a_huge_file_is_not_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(committed_manifest, "MAX_MANIFEST_BYTES", 100)
    (tmp_path / "manifest.json").write_text(json.dumps({**GOOD, "pad": "x" * 1000}))

    found = read_committed_manifest(str(tmp_path))

    assert found.manifest is None and "over 100 bytes" in found.why_not


def test_a_folder_named_manifest_json_is_no_manifest(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").mkdir()
    assert read_committed_manifest(str(tmp_path)).manifest is None


def test_a_manifest_that_is_a_link_is_not_read_through(tmp_path: Path) -> None:
    # Whoever can write the output could point manifest.json at a JSON file only Airflow may read.
    secret = tmp_path / "airflow-secret.json"
    secret.write_text(json.dumps(GOOD))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "manifest.json").symlink_to(secret)

    found = read_committed_manifest(str(tmp_path / "out"))

    assert found.manifest is None and "is a link" in found.why_not
    for scheme in ("file://", "FILE://", "File://"):  # any case of the scheme reads local disk so
        found = read_committed_manifest(f"{scheme}{tmp_path}/out")
        assert found.manifest is None and "is a link" in found.why_not, (scheme, found)


def test_a_dry_runs_manifest_is_not_read_through_a_link_below_the_output(tmp_path: Path) -> None:
    secret = tmp_path / "private"
    (secret / "rk").mkdir(parents=True)
    (secret / "rk" / "manifest.json").write_text(json.dumps(GOOD))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "_dry_runs").symlink_to(secret)

    found = read_committed_manifest(str(tmp_path / "out" / "_dry_runs" / "rk"), within=str(tmp_path / "out"))

    assert found.manifest is None and "is a link" in found.why_not


def test_a_scheme_airflow_cannot_read_is_a_reason(tmp_path: Path) -> None:
    found = read_committed_manifest("nosuchscheme://bucket/out")

    assert found.manifest is None and "cannot be read from Airflow" in found.why_not


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        ({**GOOD, "job_id": "j1"}, True),
        ({**GOOD, "job_id": "j2"}, False),
        ({**GOOD, "job_id": "j1", "status": "partial"}, False),
        ({**GOOD, "run_key": "rk", "spec_fingerprint": "fp"}, True),  # written before job ids
        ({**GOOD, "run_key": "rk", "spec_fingerprint": "other"}, False),
        ({**GOOD, "run_key": "other", "spec_fingerprint": "fp"}, False),
        (GOOD, False),
    ],
)
def test_is_result_of(manifest: dict, expected: bool) -> None:
    assert is_result_of(manifest, "j1", "rk", "fp") is expected


def test_a_read_that_hangs_is_given_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    release = threading.Event()
    monkeypatch.setattr(committed_manifest, "READ_TIMEOUT_SECONDS", 0.2)
    monkeypatch.setattr(committed_manifest, "_read_bytes", lambda uri, conn_id, within=None: release.wait(30))

    found = read_committed_manifest(str(tmp_path))
    release.set()

    assert found.manifest is None and "did not answer within" in found.why_not
