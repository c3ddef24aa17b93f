"""pipeline/generate/engine_caches.py: the cache folders a replica names to its engine, made private.

Their hostile cases (links, other owners, folders others can write, the node's folders, torch's /tmp
default) are in tests/security/test_compile_cache.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_provider_raybatch.pipeline.generate import engine_caches


def env_of(cache_dir: str | None, environ: dict[str, str]) -> dict[str, str]:
    return engine_caches.environment(engine_caches.cache_folders(cache_dir, environ))


def test_a_compile_cache_dir_holds_vllm_s_cache_triton_s_kernels_and_inductor_s_code() -> None:
    """Ours wins over the node's: the pool's fingerprint names compile_cache_dir, not the node's folders."""
    env = env_of("/mnt/compile", {"TRITON_CACHE_DIR": "/node/triton", "VLLM_CACHE_ROOT": "/node/vllm"})
    assert env == {
        "VLLM_CACHE_ROOT": "/mnt/compile",
        "TRITON_CACHE_DIR": "/mnt/compile/triton",
        "TORCHINDUCTOR_CACHE_DIR": "/mnt/compile/inductor",
    }


def test_without_one_the_defaults_are_made_explicit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Set, Inductor leaves Triton's alone: the first run's kernels are where the second run looks; and
    vLLM and Inductor use exactly the folders that were checked."""
    monkeypatch.setenv("HOME", "/home/ray")
    assert env_of(None, {}) == {
        "VLLM_CACHE_ROOT": "/home/ray/.cache/vllm",
        "TRITON_CACHE_DIR": "/home/ray/.triton/cache",
        "TORCHINDUCTOR_CACHE_DIR": "/home/ray/.cache/vllm/inductor",
    }
    assert env_of("~/cache", {}) == {
        "VLLM_CACHE_ROOT": "/home/ray/cache",
        "TRITON_CACHE_DIR": "/home/ray/cache/triton",
        "TORCHINDUCTOR_CACHE_DIR": "/home/ray/cache/inductor",
    }


@pytest.mark.parametrize(
    ("environ", "vllm_root"),
    [
        ({"VLLM_CACHE_ROOT": "/node/vllm", "XDG_CACHE_HOME": "/xdg"}, "/node/vllm"),
        ({"VLLM_CACHE_ROOT": "~/vllm"}, "/home/ray/vllm"),  # vLLM expands it
        ({"XDG_CACHE_HOME": "/xdg"}, "/xdg/vllm"),
        ({"VLLM_CACHE_ROOT": "", "XDG_CACHE_HOME": ""}, "/home/ray/.cache/vllm"),  # empty: unset
    ],
)
def test_vllm_s_cache_root_is_where_vllm_would_look(
    environ: dict[str, str], vllm_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", "/home/ray")
    env = env_of(None, environ)
    assert (env["VLLM_CACHE_ROOT"], env["TORCHINDUCTOR_CACHE_DIR"]) == (vllm_root, f"{vllm_root}/inductor")


def test_a_node_s_own_triton_folder_is_kept() -> None:
    assert env_of(None, {"TRITON_CACHE_DIR": "/node/triton"})["TRITON_CACHE_DIR"] == "/node/triton"


def test_the_cache_folders_are_made_private_before_the_engine_starts(tmp_path: Path) -> None:
    cache = tmp_path / "volume" / "vllm-cache"
    old = os.umask(0o002)  # a umask that would leave folders group-writable
    try:
        folders = engine_caches.checked_cache_folders(str(cache), {})
    finally:
        os.umask(old)

    assert folders == engine_caches.cache_folders(str(cache), {})
    made = [tmp_path / "volume", cache, cache / "triton", cache / "inductor"]
    assert [oct(path.stat().st_mode & 0o777) for path in made] == [oct(0o700)] * 4


@pytest.mark.parametrize("mode", [0o700, 0o755], ids=oct)
def test_an_existing_compile_cache_of_the_ray_user_is_used_and_kept_private(
    tmp_path: Path, mode: int
) -> None:
    """A folder made by hand or by an earlier run (vLLM and Triton make theirs 0755 under a 022 umask),
    such as a persistent volume's folder chowned to the Ray user: what it holds is the earlier runs',
    and only the Ray user reads it (0755 let every local user read the compiled code)."""
    cache = tmp_path / "vllm-cache"
    (cache / "triton" / "k").mkdir(parents=True)
    (cache / "triton" / "k" / "kernel.so").write_bytes(b"an earlier run's kernel")
    for folder in (cache, cache / "triton"):
        folder.chmod(mode)

    engine_caches.checked_cache_folders(str(cache), {})

    assert (cache / "triton" / "k" / "kernel.so").read_bytes() == b"an earlier run's kernel"
    assert [oct(folder.stat().st_mode & 0o777) for folder in (cache, cache / "triton")] == [oct(0o700)] * 2


def test_without_one_the_default_folders_are_made_private_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    monkeypatch.setenv("HOME", str(home))

    engine_caches.checked_cache_folders(None, {})

    made = [
        home / ".triton",
        home / ".triton" / "cache",
        home / ".cache",
        home / ".cache" / "vllm",
        home / ".cache" / "vllm" / "inductor",
    ]
    assert [oct(path.stat().st_mode & 0o777) for path in made] == [oct(0o700)] * len(made)
