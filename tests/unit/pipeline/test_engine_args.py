"""Tests of airflow_provider_raybatch/pipeline/generate/engine_args.py: a key of ``engine_kwargs`` vLLM
does not take fails the job at its start, naming it (else every replica dies in its
constructor and is restarted, for minutes)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from airflow_provider_raybatch.pipeline.generate import engine_args
from airflow_provider_raybatch.pipeline.generate.engine_args import UnknownEngineArgumentError
from tests.conftest import CPU_ENGINE_KWARGS, RAY_VENV

#: A vllm/engine/arg_utils.py as vLLM writes it: dataclass fields, a subclass, and other code.
ARG_UTILS = textwrap.dedent(
    """
    from dataclasses import dataclass, field

    def helper(max_model_length: int) -> None: ...

    @dataclass
    class EngineArgs:
        model: str = "facebook/opt-125m"
        max_model_len: int | None = None
        enforce_eager: bool = False
        limit_mm_per_prompt: dict = field(default_factory=dict)

        def create_engine_config(self) -> None:
            not_a_field: int = 1

    @dataclass
    class AsyncEngineArgs(EngineArgs):
        enable_log_requests: bool = False

    class Other:
        max_model_length: int = 0
    """
)


@pytest.fixture
def vllm_dir(tmp_path: Path) -> Path:
    (tmp_path / "vllm" / "engine").mkdir(parents=True)
    (tmp_path / "vllm" / "engine" / "arg_utils.py").write_text(ARG_UTILS)
    return tmp_path / "vllm"


def test_the_names_are_the_fields_of_the_two_engine_argument_classes(vllm_dir: Path) -> None:
    assert engine_args.engine_argument_names(vllm_dir) == {
        "model",
        "max_model_len",
        "enforce_eager",
        "limit_mm_per_prompt",
        "enable_log_requests",
    }


def test_a_misspelled_key_is_refused_naming_it_and_the_one_meant(vllm_dir: Path) -> None:
    known = engine_args.engine_argument_names(vllm_dir)

    with pytest.raises(UnknownEngineArgumentError) as raised:
        engine_args.check_engine_kwargs({"max_model_length": 512, "enforce_eager": True, "zzz": 1}, known)

    message = str(raised.value)
    assert "engine_kwargs['max_model_length'] (did you mean 'max_model_len'?)" in message
    assert "engine_kwargs['zzz']:" in message  # no close match: named alone
    assert "enforce_eager" not in message  # a known key is not blamed
    assert "No engine was started" in message


def test_known_keys_pass(vllm_dir: Path) -> None:
    engine_args.check_engine_kwargs(
        {"max_model_len": 512, "enable_log_requests": False}, engine_args.engine_argument_names(vllm_dir)
    )


@pytest.mark.parametrize("layout", ["no file", "not python", "no such classes"])
def test_an_unreadable_source_checks_nothing_and_the_engine_decides(tmp_path: Path, layout: str) -> None:
    folder = tmp_path / "vllm"
    (folder / "engine").mkdir(parents=True)
    if layout == "not python":
        (folder / "engine" / "arg_utils.py").write_text("class EngineArgs(:\n")
    elif layout == "no such classes":
        (folder / "engine" / "arg_utils.py").write_text("class Args:\n    x: int = 1\n")

    known = engine_args.engine_argument_names(folder)

    assert known is None
    engine_args.check_engine_kwargs({"max_model_length": 512}, known)  # nothing to check against
    assert engine_args.engine_argument_names(None) is None


def test_the_cluster_sides_vllm_knows_every_engine_argument_the_tests_and_the_demo_pass() -> None:
    """The real vllm/engine/arg_utils.py of the cluster side's virtualenv, as the job's driver reads it."""
    [vllm_dir] = list(RAY_VENV.glob("lib/python*/site-packages/vllm"))
    known = engine_args.engine_argument_names(vllm_dir)

    assert known is not None and {"max_model_len", "tensor_parallel_size", "enable_log_requests"} <= known
    engine_args.check_engine_kwargs({**CPU_ENGINE_KWARGS, "limit_mm_per_prompt": {"image": 1}}, known)
    # Ray Data LLM's stage takes task_type out of engine_kwargs itself (vLLMEngineProcessorConfig
    # moves it there): not vLLM's, still accepted.
    engine_args.check_engine_kwargs({"task_type": "embed"}, known)
    with pytest.raises(UnknownEngineArgumentError, match="did you mean 'max_model_len'"):
        engine_args.check_engine_kwargs({"max_model_length": 512}, known)


def test_without_vllm_installed_there_is_no_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_args.importlib.util, "find_spec", lambda name: None)

    assert engine_args.installed_vllm_dir() is None
