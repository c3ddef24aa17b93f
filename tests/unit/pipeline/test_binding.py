"""What staged, held and kept rows are bound to (pipeline/stage/binding.py)."""

from __future__ import annotations

import importlib
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_raybatch.pipeline.stage import binding
from airflow_provider_raybatch.pipeline.stage.binding import InputChangedError, RunBinding
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec
from tests.unit.pipeline.test_prepared_cache import _listed, _rewrite_keeping_size_and_mtime, use_s3_server


def _spec(**params: str) -> BatchInferenceSpec:
    return BatchInferenceSpec.build(
        model="m", input_uri="in.jsonl", output_uri="out", user_template="{a}", **params
    )


def test_changes_name_what_differs_and_an_unrecorded_binding_differs_in_everything() -> None:
    before = RunBinding(spec="s", input="i", code="c", model="m")

    assert before.changes_from(before) == []
    assert RunBinding("s", "i2", "c2", "m").changes_from(before) == [
        "the input files",
        "the code (the provider's, or the module of preprocess or postprocess)",
    ]
    assert before.changes_from(None) == ["what it was made from (not recorded)"]
    assert RunBinding.from_dict(before.as_dict()) == before
    assert RunBinding.from_dict({"spec": "s"}) is None and RunBinding.from_dict("x") is None
    assert before.digest() != RunBinding("s", "i", "c", "m2").digest()


def test_the_code_digest_follows_the_content_of_the_authors_module(tmp_path: Path, monkeypatch) -> None:
    """A preprocess fixed under the same dotted path: the same spec, another code digest."""
    package = tmp_path / "team_rows"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "steps.py").write_text("def clean(row):\n    return row\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = _spec(preprocess="team_rows.steps.clean")

    first = binding.code_digest(spec)
    assert binding.code_digest(spec) == first and binding.code_digest(_spec()) != first
    (package / "steps.py").write_text("def clean(row):\n    return {**row, 'a': row['a'].strip()}\n")
    sys.modules.pop("team_rows.steps", None)
    importlib.invalidate_caches()
    assert binding.code_digest(spec) != first


def test_the_code_digest_follows_every_file_the_authors_package_ships(tmp_path: Path, monkeypatch) -> None:
    """A prompt template beside the code is shipped with it and changes the answers as the code does;
    byte code and a secret-named file are not shipped (shared/packaging.py), so they change nothing."""
    package = tmp_path / "team_prompts"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "steps.py").write_text("def clean(row):\n    return row\n")
    (package / "template.txt").write_text("Classify: {text}")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = _spec(preprocess="team_prompts.steps.clean")
    first = binding.code_digest(spec)

    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "steps.cpython-311.pyc").write_bytes(b"\0")
    (package / "secret_token.txt").write_text("x")
    assert binding.code_digest(spec) == first
    (package / "template.txt").write_text("Classify this ticket: {text}")
    assert binding.code_digest(spec) != first


def test_the_binding_follows_the_engines_libraries(monkeypatch) -> None:
    """vLLM upgraded on the cluster between two tries: the rows staged by the old one are another
    engine's answers."""
    import importlib.metadata

    versions = {"ray": "2.60.0", "vllm": "0.11.0", "transformers": "4.57.1"}

    def version(name: str) -> str:
        if name not in versions:
            raise importlib.metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(importlib.metadata, "version", version)
    before = binding.binding_of(_spec(), "input")
    assert before.engine == "ray==2.60.0,vllm==0.11.0,transformers==4.57.1"
    versions["vllm"] = "0.11.1"
    after = binding.binding_of(_spec(), "input")
    assert after.changes_from(before) == ["the engine's libraries (Ray, vLLM, transformers, torch)"]


def test_the_model_digest_follows_its_files_and_a_hub_id_is_itself(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    first = binding.model_digest(str(model))

    assert binding.model_digest(str(model)) == first
    (model / "config.json").write_text('{"a": 1}')
    os.utime(model / "config.json", (2_000_000_000, 2_000_000_000))
    assert binding.model_digest(str(model)) != first
    assert binding.model_digest("Qwen/Qwen2.5-1.5B-Instruct") == "Qwen/Qwen2.5-1.5B-Instruct"


@pytest.mark.parametrize("by_rename", [False, True], ids=["in_place", "renamed_over"])
def test_model_weights_rewritten_keeping_size_and_mtime_are_another_model(
    tmp_path: Path, by_rename: bool
) -> None:
    """New weights copied over the old with ``cp -p`` or ``rsync -t``: path, size and modification time
    are as they were; the status-change time is not. Staged rows and a warm pool are another model's."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    weights = model / "model.safetensors"
    weights.write_bytes(b"weights-1")
    first, listed = binding.model_digest(str(model)), _listed(str(model), None)
    time.sleep(0.02)  # a ctime tick (tests/unit/pipeline/test_prepared_cache.py says why)
    assert binding.model_digest(str(model)) == first  # read again, unchanged: the same model

    _rewrite_keeping_size_and_mtime(weights, b"weights-2", by_rename=by_rename)
    assert _listed(str(model), None) == listed
    assert binding.model_digest(str(model)) != first


def test_a_model_on_s3_rewritten_with_as_many_bytes_is_another_model(
    s3_server: Any,  # Any: conftest S3Server
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """S3 lists modification times in whole seconds: weights rewritten with as many bytes within the
    second list as they did. Their ETag differs."""
    client = s3_server.client()
    bucket = f"model-digest-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    use_s3_server(s3_server, monkeypatch)
    model = f"s3://{bucket}/models/tiny/"
    client.put_object(Bucket=bucket, Key="models/tiny/config.json", Body=b"{}")
    for _ in range(5):  # until both writes fall in one second
        client.put_object(Bucket=bucket, Key="models/tiny/model.safetensors", Body=b"weights-1")
        before, first = _listed(model, None), binding.model_digest(model)
        assert binding.model_digest(model) == first
        client.put_object(Bucket=bucket, Key="models/tiny/model.safetensors", Body=b"weights-2")
        if _listed(model, None) == before:
            break
    else:
        pytest.fail("five rewrites in a row listed another modification time: none tests the case")
    assert binding.model_digest(model) != first


def test_an_input_changed_while_the_job_ran_commits_nothing() -> None:
    bound = RunBinding(spec="s", input="as-read")

    binding.check_input_unchanged(bound, "as-read", "s3://b/in/")
    with pytest.raises(InputChangedError, match=r"s3://b/in/ changed while this job ran"):
        binding.check_input_unchanged(bound, "rewritten", "s3://b/in/")
