"""The OpenAI API's file store on a local folder: files, output files, batch records."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_raybatch.openai_api.app import _count_requests, completion_window_seconds
from airflow_provider_raybatch.openai_api.store import NotFoundError, OpenAIStore, public


def test_upload_read_and_delete(tmp_path: Path) -> None:
    store = OpenAIStore(str(tmp_path))
    record = store.add_file(iter([b'{"a": 1}\n', b'{"b": 2}\n']), "in.jsonl", "batch")
    assert record["bytes"] == 18 and record["id"].startswith("file-")
    assert "uri" not in public(record) and public(record)["object"] == "file"
    assert b"".join(store.file_content(record["id"])) == b'{"a": 1}\n{"b": 2}\n'
    assert [r["id"] for r in store.files()] == [record["id"]]
    store.delete_file(record["id"])
    with pytest.raises(NotFoundError):
        store.file(record["id"])
    assert not Path(record["uri"]).exists()


def test_an_output_file_is_its_part_files_in_order(tmp_path: Path) -> None:
    store = OpenAIStore(str(tmp_path))
    outputs = tmp_path / "run" / "outputs"
    outputs.mkdir(parents=True)
    (outputs / "part-b.jsonl").write_text("2\n")
    (outputs / "part-a.jsonl").write_text("1\n")
    store.add_output_file("file-x-output", str(outputs), "x_output.jsonl", store.size_of(str(outputs)))
    assert store.file("file-x-output")["bytes"] == 4
    assert b"".join(store.file_content("file-x-output")) == b"1\n2\n"
    store.delete_file("file-x-output")
    assert (outputs / "part-a.jsonl").exists()  # output lines stay with their run


def test_ids_are_never_paths(tmp_path: Path) -> None:
    store = OpenAIStore(str(tmp_path))
    for bad in ("../secrets", "a/b", ".."):
        with pytest.raises(NotFoundError):
            store.file(bad)


def test_batches_list_newest_first(tmp_path: Path) -> None:
    store = OpenAIStore(str(tmp_path))
    for i, created in enumerate((5, 9, 7)):
        store.save_batch({"id": f"batch_{i}", "created_at": created})
    assert [b["id"] for b in store.batches()] == ["batch_1", "batch_2", "batch_0"]
    assert store.output_uri("batch_1") == str(tmp_path / "batches" / "batch_1" / "output")


def test_requests_are_the_non_blank_lines_across_chunks() -> None:
    assert _count_requests(iter([b'{"a"', b': 1}\n\n  \n{"b": 2}'])) == 2
    assert _count_requests(iter([b""])) == 0


@pytest.mark.parametrize(
    ("window", "seconds"),
    [("24h", 86400), ("90m", 5400), ("45s", 45), ("7d", 604800), ("24", None), ("0h", None), ("1.5h", None),
     ("h", None), (" 24h", None), ("24H", None)],
)  # fmt: skip
def test_completion_window_is_24h_or_another_duration(window: str, seconds: int | None) -> None:
    assert completion_window_seconds(window) == seconds
