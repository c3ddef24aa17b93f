"""A version or run key read from the output is used as a folder only if it is a name we issue.

Whoever can write the output can plant files in it (docs/security.md). A version's name comes back
from ``_published/<version>.json``, the manifest and a staging's ``spec.json``, and each was used as
``versions/<version>``: an entry named ``...json`` lists the version ``..``, and collecting it deleted
``versions/..``, the whole output, manifest and current version included. A name that is not one
path segment we issue is left alone where a listing names it, and fails the run, saying which file,
where the manifest or the staging names it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.pipeline.stage import commit
from airflow_provider_raybatch.pipeline.storage import OutputLayout


@pytest.fixture
def layout(tmp_path: Path) -> OutputLayout:
    layout = OutputLayout(str(tmp_path / "out"), "daily-m-1-0123456789abcdef")
    commit.publish(layout, {"version": "v1"}, keep_versions=False)
    (tmp_path / "out" / "versions" / "v1").mkdir(parents=True, exist_ok=True)
    (tmp_path / "out" / "versions" / "v1" / "part-0.jsonl").write_text("{}\n")
    (tmp_path / "beside").mkdir()  # a folder beside the output, never the output's to delete
    return layout


@pytest.mark.parametrize(
    ("entry_name", "text"),
    [
        ("...json", '{"version": "..", "run_key": null}'),  # lists the version ".."
        ("..json", "{}"),  # lists "."
        ("v0.json", "not JSON"),
        ("v0.json", '{"run_key": "../../beside"}'),
    ],
)
def test_a_planted_published_entry_never_deletes_the_output(
    layout: OutputLayout, tmp_path: Path, caplog: pytest.LogCaptureFixture, entry_name: str, text: str
) -> None:
    published = tmp_path / "out" / "_published"
    (published / entry_name).write_text(text)

    with caplog.at_level(logging.WARNING):
        commit.collect_superseded(layout)

    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["version"] == "v1"
    assert (tmp_path / "out" / "versions" / "v1" / "part-0.jsonl").exists()
    assert (tmp_path / "beside").exists()


def test_a_manifest_naming_no_version_we_write_fails_the_run_naming_it(layout: OutputLayout) -> None:
    manifest = json.loads(storage.read_text(layout.manifest_uri))
    storage.write_text(layout.manifest_uri, json.dumps({**manifest, "version": ".."}))

    with pytest.raises(
        commit.InvariantError, match="manifest.json names version '..', which this provider never"
    ):
        commit.current_version(layout)
    with pytest.raises(commit.InvariantError, match="never writes"):
        commit.publish(layout, {"version": "v2"}, keep_versions=False)

    assert Path(layout.output_uri, "versions", "v1", "part-0.jsonl").exists()


def test_a_staging_naming_no_version_we_write_fails_the_run_before_it_stages_or_deletes(
    layout: OutputLayout, tmp_path: Path
) -> None:
    storage.write_text(layout.staged_spec_uri, json.dumps({"version": "../..", "fingerprint": "x"}))

    with pytest.raises(commit.InvariantError, match="spec.json names version '../..'.+Delete that staging"):
        commit.staged_data_uri(layout)

    assert (tmp_path / "out" / "manifest.json").exists() and (tmp_path / "beside").exists()


@pytest.mark.parametrize("name", ["20261206T093000-0123456789ab-a1b2c3", "v1", "daily-m-1-0123456789abcdef"])
def test_names_we_issue_are_folder_names(name: str) -> None:
    assert storage.is_folder_name(name)


@pytest.mark.parametrize("name", ["", ".", "..", ".hidden", "a/b", "a\\b", "x" * 129, None, 7])
def test_other_names_are_not(name: object) -> None:
    assert not storage.is_folder_name(name)
