"""pipeline/generate/engine.py: the forkserver that starts vLLM's EngineCore, the error it dies of, the
replica's restarts and its batch sizes."""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_raybatch.pipeline.generate import engine


def _write_env(path: str, name: str) -> None:  # runs in the forked child
    Path(path).write_text(os.environ.get(name, "<unset>"))


def test_the_forkserver_child_gets_the_environment_of_start_not_of_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    context = engine._forkserver_context()
    monkeypatch.setenv("RAYBATCH_TEST_LATE", "set after the forkserver started")
    process = context.Process(target=_write_env, args=(str(tmp_path / "env"), "RAYBATCH_TEST_LATE"))
    process.start()
    process.join(60)
    assert process.exitcode == 0
    assert (tmp_path / "env").read_text() == "set after the forkserver started"


def _refuse(message: str) -> None:  # runs in the forked child, as vLLM's EngineCore would die building
    raise ValueError(message)


class _WorkerFailed(Exception):  # a Ray worker's error as the EngineCore gets it: a traceback's text
    def __str__(self) -> str:
        return (
            "ray::RayWorkerWrapper.execute_method() (pid=4242, ip=10.0.0.7)\n"
            '  File "gpu_worker.py", line 9, in determine_available_memory\n'
            "ValueError: No available memory for the cache blocks."
        )


def _fail_as_a_worker() -> None:  # runs in the forked child
    raise _WorkerFailed()


def _run_child(target: Callable[..., None], *args: object) -> int | None:
    process = engine._forkserver_context().Process(target=target, args=args)
    process.start()
    process.join(60)
    return process.exitcode


def test_the_error_an_engine_core_dies_of_while_building_reaches_its_builder() -> None:
    """vLLM's parent says only "Engine core initialization failed. See root cause above"."""
    with engine.engine_core_errors() as error_of_this_build:
        folder = engine._build_error_folder
        assert folder is not None and oct(Path(folder).stat().st_mode & 0o777) == "0o700"
        assert _run_child(_write_env, os.devnull, "PATH") == 0
        assert error_of_this_build() is None  # a child that did not die leaves nothing
        assert _run_child(_refuse, "No available memory for the cache blocks.\n  Try more.") == 1
        assert error_of_this_build() == "ValueError: No available memory for the cache blocks. Try more."
    assert not Path(folder).exists()  # gone with the build
    with engine.engine_core_errors() as error_of_this_build:
        assert error_of_this_build() is None  # an earlier build's error is not this one's
        # A Ray worker's error reaches the EngineCore as a traceback's text: its last error line, whole.
        assert _run_child(_fail_as_a_worker) == 1
        assert error_of_this_build() == "ValueError: No available memory for the cache blocks."
    assert _run_child(_refuse, "after the build") == 1  # an EngineCore dying later writes nowhere
    assert engine._build_error_folder is None


def test_vllm_gets_the_forkserver_context_and_keeps_its_own_side_effects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = []
    utils = types.ModuleType("vllm.v1.engine.utils")
    utils.get_mp_context = lambda: calls.append("vllm") or "spawn context"  # type: ignore[attr-defined]
    for name in ("vllm", "vllm.v1", "vllm.v1.engine"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.engine.utils", utils)
    sys.modules["vllm.v1.engine"].utils = utils  # type: ignore[attr-defined]
    assert engine.patch_vllm_process_context()
    assert engine.patch_vllm_process_context()  # a second replica in the same process: patched once
    assert utils.get_mp_context() is engine._forkserver_context()
    assert calls == ["vllm"]


def test_without_vllm_it_leaves_spawn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm... raises ImportError
    assert engine.patch_vllm_process_context() is False


@pytest.mark.parametrize(("value", "restarts"), [(None, 3), ("", 3), ("0", 0), (" 7 ", 7)])
def test_the_job_may_set_how_often_a_replica_is_restarted(
    value: str | None, restarts: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if value is None:
        monkeypatch.delenv(engine.ENGINE_MAX_RESTARTS_ENV, raising=False)
    else:
        monkeypatch.setenv(engine.ENGINE_MAX_RESTARTS_ENV, value)
    assert engine.engine_max_restarts() == restarts


@pytest.mark.parametrize(
    "value", ["-1", "forever", "1.5", "3; rm -rf /", "1e9", "1001", "9" * 40, "9" * 5000]
)
def test_a_restart_count_that_is_not_a_whole_number_is_refused_naming_the_setting(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(engine.ENGINE_MAX_RESTARTS_ENV, value)
    with pytest.raises(ValueError, match=f"{engine.ENGINE_MAX_RESTARTS_ENV}=.*whole number"):
        engine.engine_max_restarts()


_BATCH_DEFAULTS = """
from airflow_provider_raybatch.pipeline.generate.engine import with_llm_class_batch_defaults as d
part_done([d({}), d({'max_num_seqs': 8}), d({'tensor_parallel_size': 2}),
           d({'max_num_batched_tokens': 100, 'max_num_seqs': 2}), d({'disable_log_stats': False})])
"""

_INSPECTION = """
import os, sys
os.environ['VLLM_CACHE_ROOT'] = CACHE_ROOT  # no cached answer
from airflow_provider_raybatch.pipeline.generate import engine
from vllm.model_executor.models import registry
assert engine.patch_vllm_model_inspection()
assert engine.patch_vllm_model_inspection()  # a second replica in the same process: patched once
child = registry._run_in_subprocess(lambda: 'vllm.v1.engine.core' in sys.modules)
model = registry._LazyRegisteredModel('vllm.model_executor.models.llama', 'LlamaForCausalLM')
info = model.inspect_model_cls()
part_done({'preloaded': child, 'generates': info.is_text_generation_model,
           'cached': os.listdir(os.path.join(CACHE_ROOT, 'modelinfos'))})
"""


@pytest.fixture(scope="module")
def vllm_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:  # Any: each part's JSON
    """The snippets that import vLLM, in one interpreter of the cluster's environment: one import."""
    from tests.unit.pipeline.ray_env import run_parts_in_ray_env

    cache_root = str(tmp_path_factory.mktemp("vllm_cache"))
    return run_parts_in_ray_env(
        {
            "batch_defaults": _BATCH_DEFAULTS,
            "inspection": f"CACHE_ROOT = {cache_root!r}\n" + _INSPECTION,
        }
    )


def test_the_replica_gets_raw_vllms_batch_sizes_where_the_author_set_none(
    vllm_reports: dict[str, Any],
) -> None:
    """Ray Data LLM's engine config has no usage context: vLLM's generic 2,048 tokens and 128 sequences
    per step, half of what LLM() gets on this CPU (the engine then ran ~29 prompts a step, 170 waiting)."""
    from tests.unit.pipeline.ray_env import part_report

    out = part_report(vllm_reports, "batch_defaults")
    quiet = {"disable_log_stats": True}  # LLM()'s default too: no per-step statistics in the replica
    assert out == [
        {"max_num_batched_tokens": 4096, "max_num_seqs": 256, **quiet},  # vLLM's LLM() on a CPU
        {"max_num_batched_tokens": 4096, "max_num_seqs": 8, **quiet},  # the author's value stays
        {"max_num_batched_tokens": 8192, "max_num_seqs": 512, "tensor_parallel_size": 2, **quiet},
        {"max_num_batched_tokens": 100, "max_num_seqs": 2, **quiet},
        {"max_num_batched_tokens": 4096, "max_num_seqs": 256, "disable_log_stats": False},
    ]


def test_vllm_inspects_the_model_class_in_a_forkserver_child_not_a_fresh_interpreter(
    vllm_reports: dict[str, Any],
) -> None:
    """On a node whose vLLM cache has no answer for the model's class yet, vLLM inspects it in a fresh
    interpreter that imports torch and vLLM again while the replica waits; the forkserver has them."""
    from tests.unit.pipeline.ray_env import part_report

    assert part_report(vllm_reports, "inspection") == {
        "preloaded": True,  # the forkserver's modules: vLLM's own subprocess starts with none of them
        "generates": True,
        "cached": ["vllm-model_executor-models-llama-LlamaForCausalLM.json"],  # as vLLM's own path leaves it
    }
