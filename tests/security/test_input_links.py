"""A local input file reached through a link is that file's error row, and none of its bytes is read.

Whoever may write a local input folder planted ``zz.jsonl -> ~ray/.aws/credentials``: Ray's reader
follows the link, and each line of the key file came back as an error row quoting it (JSONL) or as a
good row sent to the model and kept in the outputs (CSV). Image paths were already held inside the
input folder with links resolved; input files now are too, checked on the bytes read.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_raybatch.pipeline import row_steps

SECRET = "[default]\naws_access_key_id = AKIAEXAMPLE\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG\n"


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file only the Ray user may read, outside the input folder."""
    path = tmp_path / "ray_home" / ".aws" / "credentials"
    path.parent.mkdir(parents=True)
    path.write_text(SECRET)
    path.chmod(0o600)
    return path


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    path = tmp_path / "input" / "2026-12-06"
    path.mkdir(parents=True)
    (path / "reviews.jsonl").write_text('{"text": "great"}\n')
    return path


def _records(path: Path, input_uri: Path, input_format: str = "jsonl") -> list[dict[str, str | None]]:
    """What the job parses of one file, given the bytes Ray's reader reads through any link."""
    file_row = {"path": str(path), "bytes": path.read_bytes()}
    return list(row_steps.parse_file_row(file_row, str(input_uri), input_format))  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "input_format"), [("zz.jsonl", "jsonl"), ("zz.csv", "csv")])
def test_a_linked_input_file_is_its_error_row_and_nothing_of_the_target(
    folder: Path, secret: Path, name: str, input_format: str
) -> None:
    (folder / name).symlink_to(secret)

    records = _records(folder / name, folder, input_format)

    assert [record["source"] for record in records] == [f"{name}:0"]
    assert records[0]["row"] is None
    assert f"input file refused: '{name}' is read through a link" in (records[0]["error"] or "")
    assert "AKIA" not in repr(records) and "aws_secret" not in repr(records)


def test_a_file_in_a_linked_folder_is_refused_naming_the_folder(folder: Path, secret: Path) -> None:
    (secret.parent / "keys.jsonl").write_text('{"text": "theirs"}\n')
    (folder / "more").symlink_to(secret.parent)

    records = _records(folder / "more" / "keys.jsonl", folder)

    assert [record["source"] for record in records] == ["more/keys.jsonl:0"]
    assert "('more' is one)" in (records[0]["error"] or "")


def test_one_named_input_file_that_is_a_link_is_refused(folder: Path, secret: Path) -> None:
    (folder / "reviews.jsonl").unlink()
    (folder / "reviews.jsonl").symlink_to(secret)

    records = _records(folder / "reviews.jsonl", folder / "reviews.jsonl")

    assert [record["source"] for record in records] == ["reviews.jsonl:0"]
    assert "AKIA" not in repr(records)


def test_bytes_read_through_a_link_since_swapped_for_a_file_are_refused(folder: Path, secret: Path) -> None:
    """The bytes parsed must be the file's now: a link swapped back after Ray's read proves nothing."""
    (folder / "zz.jsonl").write_text('{"text": "a plain file now"}\n')
    file_row = {"path": str(folder / "zz.jsonl"), "bytes": secret.read_bytes()}

    records = list(row_steps.parse_file_row(file_row, str(folder), "jsonl"))

    assert [record["source"] for record in records] == ["zz.jsonl:0"]
    assert "changed while the job read it" in (records[0]["error"] or "")
    assert "AKIA" not in repr(records)


def test_plain_files_inside_the_folder_are_read_as_before(folder: Path) -> None:
    (folder / "sub").mkdir()
    (folder / "sub" / "more.jsonl").write_text('{"text": "fine"}\n')

    assert [record["source"] for record in _records(folder / "reviews.jsonl", folder)] == ["reviews.jsonl:1"]
    assert [record["source"] for record in _records(folder / "sub" / "more.jsonl", folder)] == [
        "sub/more.jsonl:1"
    ]
    assert [record["error"] for record in _records(folder / "reviews.jsonl", folder / "reviews.jsonl")] == [
        None
    ]


def test_a_file_whose_name_breaks_a_line_is_its_error_row_with_the_name_escaped(folder: Path) -> None:
    # Ray's own messages (a file it cannot open) quote a path as it is: a line break in a name started
    # a RAYBATCH_PROGRESS_JSON= line of the job's log.
    name = 'x\nRAYBATCH_PROGRESS_JSON={"rows_done": 777777}\n.jsonl'
    (folder / name).write_text('{"text": "hi"}\n')

    records = _records(folder / name, folder)

    assert [record["source"] for record in records] == [f"{name}:0"]
    assert records[0]["row"] is None
    assert "has a control character or line break in its name" in (records[0]["error"] or "")
    assert "\n" not in (records[0]["error"] or "")
