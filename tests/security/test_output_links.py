"""No cleanup of, and no write into, a local output folder follows a link below it.

Whoever may write a shared output folder could swap one of its folders for a link to a folder
elsewhere that the Ray user may write (its home, a model cache, another deployment's output). Each
try's sweep of the current version listed the linked folder through the link and deleted every file
there that is not a committed part; the staging's cleanups deleted through a linked ``_staging``. Now
a link on the way to a folder the job cleans refuses the cleanup, naming it, and a link inside one is
removed as a link: the folder it names keeps its files. Writes went by path as well: a replica's part
and its sidecar landed in the folder a linked ``versions/<v>/outputs`` or ``_staging/<run_key>``
named. Now a write refuses a link on the way, naming it, and replaces a link at its own name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.pipeline.stage import commit
from airflow_provider_raybatch.pipeline.stage.parts import PartWriter
from airflow_provider_raybatch.pipeline.storage import OutputLayout
from airflow_provider_raybatch.shared.local_tree import LinkInOutputError
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

VERSION = "20261206T000000-abc-123456"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A folder beside the output that the Ray user may write, with files of someone else's."""
    folder = tmp_path / "victim"
    (folder / "sub").mkdir(parents=True)
    (folder / "precious.txt").write_text("keep me")
    (folder / "sub" / "precious2.txt").write_text("keep me")
    return folder


def _victim_files(victim: Path) -> list[str]:
    return sorted(str(path.relative_to(victim)) for path in victim.rglob("*") if path.is_file())


@pytest.fixture
def committed(tmp_path: Path) -> OutputLayout:
    """An output whose current version lists one part, ``part-aaa``."""
    out = tmp_path / "out"
    (out / "versions" / VERSION / "outputs").mkdir(parents=True)
    (out / "versions" / VERSION / "errors").mkdir()
    (out / "versions" / VERSION / "outputs" / "part-aaa.jsonl").write_text("{}\n")
    (out / "versions" / VERSION / "parts.json").write_text(json.dumps(["part-aaa"]))
    (out / "manifest.json").write_text(json.dumps({"version": VERSION}))
    return OutputLayout(str(out), "daily-m-1-0123456789abcdef")


def test_the_sweep_of_a_version_folder_swapped_for_a_link_deletes_nothing_there(
    committed: OutputLayout, victim: Path
) -> None:
    outputs = Path(committed.version_uri(VERSION)) / "outputs"
    for path in outputs.iterdir():
        path.unlink()
    outputs.rmdir()
    outputs.symlink_to(victim)

    with pytest.raises(LinkInOutputError, match=r"outputs' is a link"):
        commit.sweep_current_version(committed)

    assert _victim_files(victim) == ["precious.txt", "sub/precious2.txt"]


def test_links_inside_a_version_folder_are_removed_as_links(committed: OutputLayout, victim: Path) -> None:
    version = Path(committed.version_uri(VERSION))
    (version / "outputs" / "zz.jsonl").symlink_to(victim / "precious.txt")
    (version / "errors" / "sub").symlink_to(victim / "sub")
    (version / "outputs" / "part-aaa.jsonl").unlink()  # a committed part's name as a link: not ours
    (version / "outputs" / "part-aaa.jsonl").symlink_to(victim / "precious.txt")

    assert commit.sweep_current_version(committed) == 3

    assert list((version / "outputs").iterdir()) == []
    assert list((version / "errors").iterdir()) == []
    assert _victim_files(victim) == ["precious.txt", "sub/precious2.txt"]


def test_a_linked_staging_folder_is_refused_not_deleted_through(
    committed: OutputLayout, victim: Path, tmp_path: Path
) -> None:
    (victim / committed.run_key).mkdir()
    (victim / committed.run_key / "theirs.txt").write_text("keep me")
    Path(committed.staging_uri).parent.symlink_to(victim)  # _staging -> the victim's folder
    spec = BatchInferenceSpec.build(
        model="m",
        input_uri=str(tmp_path / "in.jsonl"),
        output_uri=committed.output_uri,
        run_key=committed.run_key,
        user_template="{text}",
    )

    with pytest.raises(LinkInOutputError, match=r"_staging' is a link"):
        commit.open_staging(committed, spec)

    assert (victim / committed.run_key / "theirs.txt").exists()


def test_a_published_version_that_is_a_link_goes_as_a_link(committed: OutputLayout, victim: Path) -> None:
    out = Path(committed.output_uri)
    (out / "_published").mkdir()
    (out / "_published" / "evil.json").write_text(json.dumps({"version": "evil", "run_key": None}))
    (out / "versions" / "evil").symlink_to(victim)

    commit.collect_superseded(committed)

    assert not (out / "versions" / "evil").is_symlink()
    assert _victim_files(victim) == ["precious.txt", "sub/precious2.txt"]


def test_an_output_listing_neither_follows_nor_lists_links(tmp_path: Path, victim: Path) -> None:
    folder = tmp_path / "out" / "parts"
    folder.mkdir(parents=True)
    (folder / "part-a.json").write_text("{}")
    (folder / "part-b.json").symlink_to(victim / "precious.txt")
    (folder / "more").symlink_to(victim)

    listed = storage.list_files(str(folder), within=str(tmp_path / "out"))

    assert listed == [str(folder / "part-a.json")]


def _row() -> Any:
    record = {"row_id": "in.jsonl:1", "text": "a row", "generated_text": "g"}
    return {"source": "in.jsonl:1", "ok": True, "record": json.dumps(record), "tokens": [1, 1]}


def test_a_part_is_not_written_through_a_linked_version_folder(committed: OutputLayout, victim: Path) -> None:
    version = "20261207T000000-abc-654321"
    (Path(committed.version_uri(version))).mkdir(parents=True)
    Path(committed.version_uri(version), "outputs").symlink_to(victim)  # swapped in after the checks
    Path(committed.staging_uri).mkdir(parents=True)
    Path(committed.staged_spec_uri).write_text(json.dumps({commit.STAGED_VERSION_KEY: version}))
    writer = PartWriter(
        committed.staging_uri, "parquet", count_labels=False, data_uri=committed.version_uri(version)
    )

    with pytest.raises(LinkInOutputError, match=r"outputs' is a link"):
        writer.write_part([_row()])

    assert _victim_files(victim) == ["precious.txt", "sub/precious2.txt"]


def test_a_part_is_not_written_through_a_linked_staging_folder(committed: OutputLayout, victim: Path) -> None:
    Path(committed.staging_uri).parent.mkdir(parents=True)
    Path(committed.staging_uri).symlink_to(victim)
    writer = PartWriter(committed.staging_uri, "jsonl", count_labels=False)

    with pytest.raises(LinkInOutputError, match=r"is a link"):
        writer.create_folders()
    with pytest.raises(LinkInOutputError, match=r"is a link"):
        writer.write_part([_row()])

    assert _victim_files(victim) == ["precious.txt", "sub/precious2.txt"]


def test_a_write_replaces_a_link_at_its_name_and_never_writes_through_it(
    committed: OutputLayout, victim: Path
) -> None:
    target = Path(committed.output_uri) / "_staging" / "x" / "spec.json"
    target.parent.mkdir(parents=True)
    target.symlink_to(victim / "precious.txt")

    storage.write_text(str(target), "{}", within=committed.output_uri)

    assert not target.is_symlink() and target.read_text() == "{}"
    assert (victim / "precious.txt").read_text() == "keep me"
    assert sorted(path.name for path in target.parent.iterdir()) == ["spec.json"]  # no temporary left
