"""The OpenAI API's file store on a local folder: files, output files, batch records.

Hostile ids and records (an attacker's) are in tests/security/test_openai_store.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_raybatch.openai_api.app import completion_window_seconds
from airflow_provider_raybatch.openai_api.store import (
    NotFoundError,
    OpenAIStore,
    TooLargeError,
    new_id,
    public,
)


def test_upload_read_and_delete(tmp_path: Path) -> None:
    store = OpenAIStore(str(tmp_path))
    record = store.add_file(iter([b'{"a": 1}\n', b'{"b": 2}\n']), "in.jsonl", "batch", owner="alice")
    assert record["bytes"] == 18 and record["id"].startswith("file-") and record["owner"] == "alice"
    assert {"uri", "owner", "owner_name"}.isdisjoint(public(record)) and public(record)["object"] == "file"
    assert b"".join(store.file_content(record["id"])) == b'{"a": 1}\n{"b": 2}\n'
    assert [r["id"] for r in store.files()] == [record["id"]]
    assert store.upload_uri(record["id"]) == str(tmp_path / "files" / f"{record['id']}.jsonl")
    store.delete_file(record["id"])
    with pytest.raises(NotFoundError):
        store.file(record["id"])
    assert not (tmp_path / "files" / f"{record['id']}.jsonl").exists()


def test_an_upload_over_the_limit_keeps_nothing(tmp_path: Path) -> None:
    store = OpenAIStore(str(tmp_path))
    with pytest.raises(TooLargeError, match="10-byte upload limit"):
        store.add_file(iter([b"0123456", b"789ab"]), "big.jsonl", "batch", max_bytes=10)
    assert list((tmp_path / "files").iterdir()) == []


def _completed_batch(store: OpenAIStore, tmp_path: Path, completed: int, failed: int) -> dict:
    batch = {"id": new_id("batch"), "created_at": 5, "owner": "alice"}
    store.save_batch(batch)
    output = Path(store.output_uri(batch["id"]))
    for kind, lines in (("outputs", ["2\n", "1\n"]), ("errors", ["e\n"])):
        (output / "versions" / "v1" / kind).mkdir(parents=True)
        for name, line in zip(("part-b.jsonl", "part-a.jsonl"), lines, strict=False):
            (output / "versions" / "v1" / kind / name).write_text(line)
    manifest = {
        "outputs_uri": str(output / "versions" / "v1" / "outputs"),
        "errors_uri": str(output / "versions" / "v1" / "errors"),
        "request_counts": {"completed": completed, "failed": failed},
    }
    (output / "manifest.json").write_text(json.dumps(manifest))
    return batch


def test_an_output_file_is_derived_from_the_batch_manifest_and_its_parts_in_order(tmp_path: Path) -> None:
    store = OpenAIStore(str(tmp_path))
    batch = _completed_batch(store, tmp_path, completed=2, failed=0)
    file_id = store.output_file_id(batch["id"], "output")
    record = store.file(file_id)
    assert record["bytes"] == 4 and record["purpose"] == "batch_output" and record["owner"] == "alice"
    assert b"".join(store.file_content(file_id)) == b"1\n2\n"
    with pytest.raises(NotFoundError):  # no failed lines: no error file
        store.file(store.output_file_id(batch["id"], "errors"))
    assert file_id in {r["id"] for r in store.files()}
    store.delete_file(file_id)
    with pytest.raises(NotFoundError):
        store.file(file_id)
    assert (Path(store.output_uri(batch["id"])) / "versions/v1/outputs/part-a.jsonl").exists()  # lines stay


def test_batches_list_newest_first(tmp_path: Path) -> None:
    store = OpenAIStore(str(tmp_path))
    ids = [new_id("batch") for _ in range(3)]
    for batch_id, created in zip(ids, (5, 9, 7), strict=True):
        store.save_batch({"id": batch_id, "created_at": created})
    assert [b["id"] for b in store.batches()] == [ids[1], ids[2], ids[0]]
    assert store.output_uri(ids[1]) == str(tmp_path / "batches" / ids[1] / "output")


@pytest.mark.parametrize(
    ("window", "seconds"),
    [
        ("24h", 86400),
        ("90m", 5400),
        ("45s", 45),
        ("7d", 604800),
        ("24", None),
        ("0h", None),
        ("1.5h", None),
        ("h", None),
        (" 24h", None),
        ("24H", None),
    ],
)
def test_completion_window_is_24h_or_another_duration(window: str, seconds: int | None) -> None:
    assert completion_window_seconds(window) == seconds


def test_a_users_listing_reads_their_own_records_only(tmp_path: Path) -> None:
    """An owner index: bob's records are never read for alice's listing (his thousands of uploads
    cannot slow hers), and a record gone between listing and reading is left out."""
    store = OpenAIStore(str(tmp_path))
    mine = store.add_file(iter([b"{}\n"]), "a.jsonl", "batch", owner="alice")
    theirs = store.add_file(iter([b"{}\n"]), "b.jsonl", "batch", owner="bob")
    (tmp_path / "files" / f"{theirs['id']}.json").write_text("{half written")
    batch = {"id": new_id("batch"), "created_at": 1, "owner": "alice"}
    store.save_batch(batch)
    assert [r["id"] for r in store.files("alice")] == [mine["id"]]
    assert [r["id"] for r in store.files(None)] == [mine["id"]]  # the unreadable one is left out
    assert [b["id"] for b in store.batches("alice")] == [batch["id"]] and store.batches("bob") == []
    assert store.count_files("alice") == 1
    (tmp_path / "files" / f"{mine['id']}.json").unlink()  # deleted while a listing runs
    assert store.files("alice") == [] and store.count_files("alice") == 1
    store.delete_batch(batch["id"])
    assert store.batches("alice") == []
