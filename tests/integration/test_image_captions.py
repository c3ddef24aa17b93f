"""Image captions as a real Ray job: the tiny random-weight VLM on vLLM's CPU engine, on dirty images.

A Parquet file of image rows (Hugging Face's ``{"bytes", "path"}`` image struct), good and corrupt,
submitted exactly as the operator submits it. Good images reach the engine (their prompts carry the
model's image tokens); every bad image is an error row with its reason; no output or error row
carries the image bytes; counts add up.
"""

from __future__ import annotations

import io
import json
import os
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from airflow_provider_raybatch.hooks.ray import JobStatus, RayHook
from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator
from airflow_provider_raybatch.shared.manifest import manifest_from_log
from tests.conftest import (
    CPU_ENGINE_KWARGS,
    CPU_REPLICA,
    run_date,
    submit_pipeline,
    wait_for_job,
    warm_conf,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

GOOD_IMAGES = 12
IMAGE_TOKENS = 16  # scripts/make_tiny_vlm.py: one 112 x 112 tile of 16 tokens per image
IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # HF datasets' Image feature


def encode(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def good_image(i: int) -> bytes:
    """Images of several formats, modes and sizes (some over image_max_side, to be shrunk)."""
    colour = (20 * i % 256, 255 - 15 * i % 256, 90)
    if i % 4 == 0:
        return encode(Image.new("RGB", (300, 120), colour), "JPEG")
    if i % 4 == 1:
        return encode(Image.new("RGBA", (50, 90), (*colour, 128)), "PNG")
    if i % 4 == 2:
        return encode(Image.linear_gradient("L").resize((96, 64)), "PNG")
    return encode(Image.new("RGB", (64, 48), colour), "PNG")


def write_image_corpus(folder: Path) -> dict[str, str]:
    """GOOD_IMAGES good rows and one corrupt image of each kind; returns {bad id: expected reason kind}."""
    rows = [
        {
            "image_id": f"img-{i:02d}",
            "filename": f"img-{i:02d}.x",
            "image": {"bytes": good_image(i), "path": None},
        }
        for i in range(GOOD_IMAGES - 1)
    ]
    # One good image given by a path relative to the Parquet file's folder.
    (folder / "photos").mkdir()
    (folder / "photos" / "beach.png").write_bytes(good_image(3))
    rows.append(
        {
            "image_id": "img-path",
            "filename": "beach.png",
            "image": {"bytes": None, "path": "photos/beach.png"},
        }
    )
    png = good_image(3)
    bad = {
        "bad-truncated": ({"bytes": png[: len(png) // 2], "path": "cut.png"}, "bad image"),
        "bad-random": ({"bytes": os.urandom(4096), "path": None}, "bad image"),
        "bad-empty": ({"bytes": b"", "path": None}, "bad image"),
        "bad-text": ({"bytes": b"this is a caption, not an image", "path": "note.txt"}, "bad image"),
        "bad-none": (None, "missing image"),
        "bad-missing-path": ({"bytes": None, "path": "photos/no-such.png"}, "missing image"),
        "bad-tiny": ({"bytes": encode(Image.new("RGB", (4, 4)), "PNG"), "path": None}, "image too small"),
        # Hostile values: a file of the node outside the input folder, the cloud metadata service.
        "bad-outside": ({"bytes": None, "path": "/etc/hostname"}, "image source not allowed"),
        "bad-metadata": (
            {"bytes": None, "path": "http://169.254.169.254/latest/"},
            "image source not allowed",
        ),
    }
    rows += [{"image_id": key, "filename": f"{key}.x", "image": value} for key, (value, _) in bad.items()]
    schema = pa.schema([("image_id", pa.string()), ("filename", pa.string()), ("image", IMAGE_TYPE)])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), folder / "images.parquet")
    return {key: kind for key, (_, kind) in bad.items()}


def test_image_captions_with_corrupt_images(ray_connection, tiny_vlm, tmp_path) -> None:
    input_folder = tmp_path / "in"
    input_folder.mkdir()
    expected_errors = write_image_corpus(input_folder)
    output_uri = str(tmp_path / "out")
    operator = RayLLMBatchOperator(
        task_id="caption",
        model=str(tiny_vlm),
        input_uri=str(input_folder / "images.parquet"),
        output_uri=output_uri,
        system_prompt="You write one-sentence image captions.",
        user_template="Describe this image in one sentence.",
        image_column="image",
        image_max_side=224,
        id_column="image_id",
        sampling_params={"temperature": 0, "max_tokens": 8},
        engine_kwargs={**CPU_ENGINE_KWARGS, "limit_mm_per_prompt": {"image": 1}},
        replica_resources=CPU_REPLICA,
        batch_size=8,
        # On the session's warm VLM engines (the DAG test below and test_row_contract's vision task).
        **warm_conf(),
    )
    # 9 of 21 images are bad on purpose, over the default max_failed_fraction (0.1): the run is held.
    held_job = submit_pipeline(operator, "captions", f"captions-held-{uuid.uuid4().hex[:8]}")
    hook = RayHook()
    assert wait_for_job(held_job) == JobStatus.FAILED, hook.get_job_log_tail(held_job, 80)
    held = manifest_from_log(hook.get_job_logs(held_job))
    assert held is not None and (held["status"], held["rows_out"]) == ("held", GOOD_IMAGES)
    assert not Path(output_uri, "manifest.json").exists()  # nothing committed
    # The author accepts them (a looser threshold, the same parameters otherwise): the retry commits the
    # held rows, captions included, without starting an engine.
    operator.max_failed_fraction = 0.5
    job_id = submit_pipeline(operator, "captions", f"captions-test-{uuid.uuid4().hex[:8]}")
    assert wait_for_job(job_id) == JobStatus.SUCCEEDED, hook.get_job_log_tail(job_id, 80)
    taken_log = hook.get_job_logs(job_id)
    assert "as the thresholds now pass them" in taken_log and "EngineStage" not in taken_log, taken_log[
        -3000:
    ]

    manifest = json.loads(Path(output_uri, "manifest.json").read_text())
    assert manifest == manifest_from_log(hook.get_job_logs(job_id))
    # This job generated nothing: what the captions cost is the held job's, in the manifest
    # and in the report the held job's message pointed at.
    assert manifest["timings"]["generating_s"] is None
    assert manifest["held_try"]["job_id"] == held_job and manifest["held_try"]["version"] == held["version"]
    assert manifest["held_try"]["timings"] == held["timings"] and held["timings"]["generating_s"] > 0
    assert "What generating these rows took" in Path(manifest["report_uri"]).read_text()
    outputs = pq.read_table(manifest["outputs_uri"]).to_pylist()
    errors = pq.read_table(manifest["errors_uri"]).to_pylist()

    # Good images: each captioned once; the image is not among the output columns.
    good_ids = [f"img-{i:02d}" for i in range(GOOD_IMAGES - 1)] + ["img-path"]
    assert sorted(row["image_id"] for row in outputs) == sorted(good_ids)
    assert set(outputs[0]) == {
        "image_id",
        "filename",
        "generated_text",
        "num_input_tokens",
        "num_generated_tokens",
    }
    assert all(isinstance(row["generated_text"], str) for row in outputs)
    # The prompt the engine saw holds the image's tokens: the image reached vLLM.
    # (46 text tokens with one <image> placeholder, expanded by vLLM to 16 image tokens + 3 markers: 64.)
    assert min(row["num_input_tokens"] for row in outputs) > IMAGE_TOKENS
    # every image is one tile, whatever its size
    assert len({row["num_input_tokens"] for row in outputs}) == 1
    assert all(row["num_generated_tokens"] >= 1 for row in outputs)

    # Bad images: one error row each, with the reason's kind; the input shows no image bytes.
    reasons = {row["id"]: row["error"] for row in errors}
    assert len(errors) == len(reasons) == len(expected_errors)
    assert {key: reason.split(":", 1)[0] for key, reason in reasons.items()} == expected_errors
    assert "no such file" in reasons["bad-missing-path"] and "empty bytes" in reasons["bad-empty"]
    inputs = {row["id"]: json.loads(row["input"]) for row in errors}
    assert all(len(row["input"]) < 300 for row in errors), max(len(row["input"]) for row in errors)
    assert inputs["bad-random"]["image"] == {"bytes": "<4096 bytes>", "path": None}
    assert inputs["bad-missing-path"]["image"] == {"bytes": None, "path": "photos/no-such.png"}
    assert inputs["bad-none"]["image"] is None

    rows_in = GOOD_IMAGES + len(expected_errors)
    assert (manifest["rows_in"], manifest["rows_out"], manifest["rows_failed"]) == (
        rows_in,
        GOOD_IMAGES,
        len(expected_errors),
    )
    assert manifest["errors_by_reason"] == dict(Counter(expected_errors.values()))
    assert manifest["tokens_in"] == sum(row["num_input_tokens"] for row in outputs)
    assert manifest["spec_fingerprint"] == operator.build_spec().fingerprint()


def test_daily_image_captions_dag(airflow_env, tiny_vlm, tmp_path) -> None:
    """dags/daily_image_captions.py through real Airflow (deferred), with the same corpus."""
    day, dag_id = "2026-11-20", "daily_image_captions"
    folder = tmp_path / "images" / day
    folder.mkdir(parents=True)
    expected_errors = write_image_corpus(folder)
    conf = {
        "model": str(tiny_vlm),
        "data_root": str(tmp_path),
        "engine_kwargs": {**CPU_ENGINE_KWARGS, "limit_mm_per_prompt": {"image": 1}},
        "image_max_side": 224,
        "replica_resources": CPU_REPLICA,
        "max_failed_fraction": 0.5,  # 9 of 21 images are bad on purpose
    }

    result = airflow_env.dags_test(dag_id, run_date(day), conf)
    log = result.stdout + result.stderr
    assert result.returncode == 0 and "state=success" in log, log[-4000:]

    manifest = airflow_env.xcoms(dag_id, run_date(day))[("caption_images", "manifest")]
    rows_in = GOOD_IMAGES + len(expected_errors)
    assert (manifest["rows_in"], manifest["rows_out"], manifest["rows_failed"]) == (
        rows_in,
        GOOD_IMAGES,
        len(expected_errors),
    )
    assert manifest["errors_by_reason"] == dict(Counter(expected_errors.values()))
    outputs = pq.read_table(manifest["outputs_uri"])
    assert outputs.num_rows == GOOD_IMAGES and "image" not in outputs.column_names
