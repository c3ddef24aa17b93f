"""A local Batch API store follows no link planted in a batch run's output, and reads its files bounded.

Whoever can write a run's output (the Ray user, any job on the cluster) wrote a link
``outputs/part-1.jsonl -> <a file only the API server can read>``: the store listed, sized and opened
the parts by path, so the batch's output file served the API server's file (and counted its bytes).
A running batch's sidecars were read whole: a 300 MiB sparse one grew the API server by 600 MiB.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_raybatch.openai_api import store as store_module
from airflow_provider_raybatch.openai_api.store import NotFoundError, OpenAIStore, new_id
from airflow_provider_raybatch.pipeline import sidecars

SECRET = b"sql_alchemy_conn = postgresql://airflow:S3CRET@db/airflow\n"


def _completed_batch(tmp_path: Path) -> tuple[OpenAIStore, str, Path, Path]:
    """A store with one completed batch whose output has one part; and a file only the server reads."""
    store = OpenAIStore(str(tmp_path / "store"))
    batch_id = new_id("batch")
    store.save_batch({"id": batch_id, "created_at": 5, "owner": "alice"})
    output = Path(store.output_uri(batch_id))
    outputs = output / "versions" / "v1" / "outputs"
    outputs.mkdir(parents=True)
    (outputs / "part-0.jsonl").write_text('{"custom_id": "1"}\n')
    manifest = {"outputs_uri": str(outputs), "request_counts": {"completed": 1, "failed": 0}}
    (output / "manifest.json").write_text(json.dumps(manifest))
    secret = tmp_path / "server-only" / "airflow.cfg"
    secret.parent.mkdir()
    secret.write_bytes(SECRET)
    return store, batch_id, output, secret


def test_a_part_that_is_a_link_is_neither_served_nor_counted(tmp_path: Path) -> None:
    store, batch_id, output, secret = _completed_batch(tmp_path)
    (output / "versions" / "v1" / "outputs" / "part-1.jsonl").symlink_to(secret)
    file_id = store.output_file_id(batch_id, "output")
    assert store.file(file_id)["bytes"] == len('{"custom_id": "1"}\n')
    assert b"".join(store.file_content(file_id)) == b'{"custom_id": "1"}\n'


def test_a_linked_outputs_folder_serves_nothing(tmp_path: Path) -> None:
    store, batch_id, output, secret = _completed_batch(tmp_path)
    outputs = output / "versions" / "v1" / "outputs"
    (outputs / "part-0.jsonl").unlink()
    outputs.rmdir()
    (secret.parent / "part-0.jsonl").write_bytes(SECRET)
    outputs.symlink_to(secret.parent)
    file_id = store.output_file_id(batch_id, "output")
    with pytest.raises(NotFoundError):
        store.file(file_id)
    with pytest.raises(NotFoundError):
        b"".join(store.file_content(file_id))


def test_a_manifest_that_is_a_link_is_not_read(tmp_path: Path) -> None:
    store, batch_id, output, secret = _completed_batch(tmp_path)
    forged = secret.parent / "manifest.json"
    forged.write_text((output / "manifest.json").read_text())
    (output / "manifest.json").unlink()
    (output / "manifest.json").symlink_to(forged)
    assert store.read_json(f"{store.output_uri(batch_id)}/manifest.json") is None
    with pytest.raises(NotFoundError):
        store.file(store.output_file_id(batch_id, "output"))


def test_sidecars_over_the_bound_or_behind_a_link_are_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, batch_id, output, secret = _completed_batch(tmp_path)
    monkeypatch.setattr(store_module, "MAX_SIDECAR_BYTES", 1_000, raising=False)
    parts = output / "_staging" / "run1" / "parts"
    parts.mkdir(parents=True)
    (parts / "a.json").write_text(json.dumps({"rows_out": 1}))
    (parts / "big.json").write_text(json.dumps({"rows_out": 10, "pad": " " * 2_000}))
    planted = secret.parent / "planted.json"
    planted.write_text(json.dumps({"rows_out": 100}))
    (parts / "linked.json").symlink_to(planted)
    (secret.parent / "parts").mkdir()
    (secret.parent / "parts" / "b.json").write_text(json.dumps({"rows_out": 1_000}))
    (output / "_staging" / "run2").symlink_to(secret.parent)
    assert [sidecar["rows_out"] for sidecar in store.staged_sidecars(batch_id)] == [1]


def test_the_sidecar_bound_is_the_pipelines() -> None:
    assert store_module.MAX_SIDECAR_BYTES == sidecars.MAX_SIDECAR_BYTES
