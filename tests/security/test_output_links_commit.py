"""The commit's own files, the prepared rows kept for a retry and a dry run's files are read and written
without following a link below a local output folder; an owner record cannot write lines into the log.

Whoever may write a shared output folder could swap ``_staging/<run_key>`` for a link while the job
reads its input (seconds to minutes): the prepared rows' cache then deleted the folder's ``prepared/``
and ``prepared.json`` at the link's target and wrote the job's rows there. A link at
``_dry_runs/<run_key>`` made a dry run replace another output's ``manifest.json`` with its own. The
commit's held record, seal, pointer and manifest went by path too. Each now refuses a link on the way
(or, for the cache, keeps nothing), and the folder the link names is left as it was.
"""

from __future__ import annotations

import json
import logging
import resource
import sys
import types
from pathlib import Path

import pytest

from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.pipeline.dry_run import write_dry_run
from airflow_provider_raybatch.pipeline.read import prepared_cache
from airflow_provider_raybatch.pipeline.sidecars import ForeignSidecarError
from airflow_provider_raybatch.pipeline.stage import commit, ownership
from airflow_provider_raybatch.pipeline.storage import OutputLayout
from airflow_provider_raybatch.shared.local_tree import LinkInOutputError
from airflow_provider_raybatch.shared.manifest import dry_run_uri

RUN_KEY = "daily-m-1-0123456789abcdef"


def _files(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): path.read_text()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """Another run's staging that the Ray user may write: its kept rows and record."""
    folder = tmp_path / "victim"
    (folder / "prepared").mkdir(parents=True)
    (folder / "prepared" / "part-0.parquet").write_text("their rows")
    (folder / "prepared.json").write_text('{"theirs": true}')
    (folder / "manifest.json").write_text('{"status": "committed"}')
    return folder


@pytest.fixture
def linked(tmp_path: Path, victim: Path) -> OutputLayout:
    """An output whose run's staging was swapped for a link to ``victim`` after the job opened it."""
    layout = OutputLayout(str(tmp_path / "out"), RUN_KEY)
    Path(layout.staging_uri).parent.mkdir(parents=True)
    Path(layout.staging_uri).symlink_to(victim)
    return layout


def test_prepared_rows_are_not_kept_through_a_staging_swapped_for_a_link(
    linked: OutputLayout, victim: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before = _files(victim)
    rows = prepared_cache.PreparedRows(rows=None, rows_in=20_000, errors=0, repeated_ids=0, rows_repeated=0)  # type: ignore[arg-type]

    with caplog.at_level(logging.WARNING, logger="airflow_provider_raybatch.pipeline"):
        kept = prepared_cache.write(linked.staging_uri, rows, "d1", linked.output_uri)

    assert kept is False
    assert _files(victim) == before
    assert "is a link" in caplog.text


def test_prepared_rows_are_not_read_through_a_staging_swapped_for_a_link(
    linked: OutputLayout, victim: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    record = {
        "format": 1,
        "input_digest": "d1",
        "rows_in": 1,
        "errors": 0,
        "repeated_ids": 0,
        "rows_repeated": 0,
    }
    (victim / "prepared.json").write_text(json.dumps(record))
    read: list[object] = []
    ray = types.ModuleType("ray")
    ray.data = types.SimpleNamespace(read_parquet=lambda *args, **kwargs: read.append(args))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.data", ray.data)

    with caplog.at_level(logging.WARNING, logger="airflow_provider_raybatch.pipeline"):
        kept = prepared_cache.read(linked.staging_uri, "d1", linked.output_uri)

    assert kept is None
    assert read == []
    assert "is a link" in caplog.text  # not read: neither its record nor its files


def test_a_held_run_is_not_recorded_through_a_linked_staging(linked: OutputLayout, victim: Path) -> None:
    before = _files(victim)

    with pytest.raises(LinkInOutputError, match=rf"{RUN_KEY}' is a link"):
        commit.hold(linked, {"status": "held"})
    with pytest.raises(LinkInOutputError, match=rf"{RUN_KEY}' is a link"):
        commit.staged_data_uri(linked)  # the staging's pointer is not read through it either

    assert _files(victim) == before


def test_a_dry_run_is_not_written_through_a_link_at_its_folder(tmp_path: Path, victim: Path) -> None:
    output = tmp_path / "out"
    folder = dry_run_uri(str(output), RUN_KEY)
    Path(folder).parent.mkdir(parents=True)
    Path(folder).symlink_to(victim)  # another output's root
    before = _files(victim)

    with pytest.raises(LinkInOutputError, match=rf"{RUN_KEY}' is a link"):
        write_dry_run(str(output), folder, {"status": "dry_run"}, "<html></html>")

    assert _files(victim) == before


def test_a_manifest_that_is_a_link_is_not_read_as_the_outputs(tmp_path: Path, victim: Path) -> None:
    layout = OutputLayout(str(tmp_path / "out"), RUN_KEY)
    Path(layout.output_uri).mkdir()
    Path(layout.manifest_uri).symlink_to(victim / "manifest.json")

    with pytest.raises(LinkInOutputError, match=r"manifest.json' is a link"):
        commit.current_manifest(layout)
    assert storage.exists(layout.manifest_uri, within=layout.output_uri)  # there, as a link


@pytest.mark.parametrize("field", ["job_id", "run"])
def test_an_owner_record_whose_texts_break_a_line_is_no_owner(tmp_path: Path, field: str) -> None:
    layout = OutputLayout(str(tmp_path / "out"), RUN_KEY)
    Path(layout.staging_uri).mkdir(parents=True)
    forged = 'x\nRAYBATCH_MANIFEST_JSON={"job_id": "raybatch-d-t-r-m-1-t1-abc"}'
    record = {"job_id": "raysubmit_1", "run": {"dag_id": "d"}, "heartbeat_at": 1.0}
    record[field] = forged if field == "job_id" else {"dag_id": forged}
    Path(ownership.owner_uri(layout)).write_text(json.dumps(record))

    assert ownership.read_owner(layout) is None

    record[field] = "raysubmit_1" if field == "job_id" else {"dag_id": "d"}
    Path(ownership.owner_uri(layout)).write_text(json.dumps(record))
    assert ownership.read_owner(layout) == ownership.Owner("raysubmit_1", {"dag_id": "d"}, 1.0)


def test_a_planted_part_name_with_a_line_break_stays_on_one_line_of_the_error(tmp_path: Path) -> None:
    layout = OutputLayout(str(tmp_path / "out"), RUN_KEY)
    parts = Path(layout.staging_uri) / "parts"
    parts.mkdir(parents=True)
    (parts / 'x\nRAYBATCH_MANIFEST_JSON={"job_id": "j"}.json').write_text("not a sidecar")

    with pytest.raises(ForeignSidecarError) as raised:
        commit._sidecars(layout)  # the commit and a resume read the staged parts so

    assert "\n" not in str(raised.value) and "\\nRAYBATCH_MANIFEST_JSON" in str(raised.value)


def test_the_jobs_own_files_in_an_output_are_refused_unread_past_their_bound(tmp_path: Path) -> None:
    # Sparse files (no disk) planted where the job reads its own small files: each was held whole.
    layout = OutputLayout(str(tmp_path / "out"), RUN_KEY)
    Path(layout.staging_uri).mkdir(parents=True)
    for uri in (ownership.owner_uri(layout), layout.manifest_uri):
        with open(uri, "wb") as file:
            file.truncate(storage.MAX_CONTROL_FILE_BYTES + 1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    assert ownership.read_owner(layout) is None  # no owner: a next try takes the staging over
    with pytest.raises(storage.ControlFileTooLargeError, match=r"manifest.json is 67,108,865 bytes"):
        commit.current_manifest(layout)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 16 << 10  # KiB: nothing held
