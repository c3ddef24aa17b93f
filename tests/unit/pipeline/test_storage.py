"""Tests of the pure parts of airflow_provider_raybatch/pipeline/storage.py (the rest needs pyarrow)."""

from __future__ import annotations

import posixpath
from pathlib import Path

import pytest

from airflow_provider_raybatch.pipeline.storage import (
    OutputLayout,
    check_model_source,
    extensions_for,
    relative_name,
)


@pytest.mark.parametrize("output_uri", ["s3://b/out", "s3://b/out/"])
def test_output_layout(output_uri: str) -> None:
    layout = OutputLayout(output_uri, "parquet")

    assert layout.outputs_uri == "s3://b/out/outputs"
    assert layout.errors_uri == "s3://b/out/errors"
    assert layout.manifest_uri == "s3://b/out/manifest.json"


def test_extensions_for_a_folder_and_a_file() -> None:
    assert extensions_for("s3://b/in/", "jsonl") == ["jsonl", "ndjson", "json"]
    assert extensions_for("s3://b/in", "parquet") == ["parquet", "pq"]
    assert extensions_for("s3://b/in/data.csv", "csv") is None


def test_relative_name() -> None:
    assert relative_name("b/in/sub/x.jsonl", "s3://b/in/") == "sub/x.jsonl"
    assert relative_name("b/in/x.jsonl", "s3://b/in/x.jsonl") == "x.jsonl"
    assert relative_name("b/input_2/x.jsonl", "s3://b/in") == "x.jsonl"
    cwd = posixpath.abspath(".")
    assert relative_name(f"{cwd}/data/in/part/a.csv", "data/in") == "part/a.csv"


def test_check_model_source(tmp_path: Path) -> None:
    check_model_source("Qwen/Qwen2.5-0.5B-Instruct")  # a Hub id: left to vLLM
    check_model_source("s3://bucket/models/qwen")
    with pytest.raises(FileNotFoundError, match="no such folder"):
        check_model_source(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        check_model_source(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    check_model_source(str(tmp_path))
