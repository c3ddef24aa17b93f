"""pipeline/engine.py: the fixed engine pool, and the forkserver that starts vLLM's EngineCore."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest

from airflow_provider_raybatch.pipeline import engine


def _write_env(path: str, name: str) -> None:  # runs in the forked child
    Path(path).write_text(os.environ.get(name, "<unset>"))


@pytest.mark.parametrize(("given", "pool"), [(1, (1, 1)), (2, (2, 2)), ((1, 4), (1, 4)), ([2, 3], (2, 3))])
def test_an_int_concurrency_is_a_fixed_pool(given: int | tuple[int, int], pool: tuple[int, int]) -> None:
    assert engine.fixed_pool(given) == pool  # type: ignore[arg-type]


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


def test_switched_off_it_leaves_the_processor_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(engine.FORKSERVER_ENV, "0")
    processor = object()
    assert engine.use_fast_engine_start(processor) is processor
