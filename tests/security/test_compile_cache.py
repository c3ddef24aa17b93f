"""A replica loads compiled graphs and kernels only from compile cache folders that are the Ray user's
alone (pipeline/generate/engine.py ``checked_compile_cache_env``, pipeline/private_folders.py).

vLLM loads its torch.compile cache from ``compile_cache_dir`` (``VLLM_CACHE_ROOT``) and Triton its
kernels from the ``triton`` folder under it (or, with ``compile_cache_dir`` unset, from
``~/.triton/cache``, which the replica names), and both run what they load in the replica. On a node
other local users share, one of them could make that folder first, or a link at its name, or a folder
above it they can write, and plant compiled code there. So every such folder is refused before the
engine starts, and the job fails naming ``compile_cache_dir``, the folder and what is wrong with it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from airflow_provider_raybatch.pipeline.generate import engine
from airflow_provider_raybatch.pipeline.private_folders import PrivateFolderError
from tests.unit.pipeline.ray_env import run_in_ray_env

pytestmark = pytest.mark.usefixtures("usual_umask")  # tests/security/conftest.py

#: What another local user plants: a kernel Triton would load and run in the replica.
PLANTED_KERNEL = b"\x7fELF a kernel of the planter's"
NOBODY = 65534


def plant(folder: Path, mode: int = 0o777) -> Path:
    """A compile cache folder as another local user leaves it: a kernel in Triton's folder."""
    (folder / "triton" / "k").mkdir(parents=True, exist_ok=True)
    kernel = folder / "triton" / "k" / "kernel.so"
    kernel.write_bytes(PLANTED_KERNEL)
    folder.chmod(mode)
    return kernel


def refusal(cache_dir: str | None) -> str:
    with pytest.raises(PrivateFolderError) as refused:
        engine.checked_compile_cache_env(cache_dir, {})
    return str(refused.value)


def test_a_link_planted_at_compile_cache_dir_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    kernel = plant(theirs, mode=0o755)
    cache = tmp_path / "vllm-cache"
    cache.symlink_to(theirs)

    message = refusal(str(cache))

    assert message.startswith(f"compile_cache_dir={str(cache)!r}: {str(cache)!r} is a symbolic link"), message
    assert kernel.read_bytes() == PLANTED_KERNEL and sorted(p.name for p in theirs.iterdir()) == ["triton"]


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o775, 0o757, 0o722], ids=oct)
def test_a_compile_cache_dir_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    """Ours or not: whoever could write it could have planted a kernel, and one in a folder we own but
    left group-writable is as hard to tell from ours as any other."""
    cache = tmp_path / "vllm-cache"
    cache.mkdir()
    plant(cache, mode=mode)

    message = refusal(str(cache))

    assert message.startswith(f"compile_cache_dir={str(cache)!r}: {str(cache)!r} is writable by its group or "
                              f"others (mode {oct(mode)})"), message  # fmt: skip
    assert "delete this one and let the next run make it again" in message


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder another user's needs root")
@pytest.mark.parametrize("whose", ["compile_cache_dir", "its triton folder"])
def test_a_folder_of_another_user_is_refused(tmp_path: Path, whose: str) -> None:
    cache = tmp_path / "vllm-cache"
    cache.mkdir()
    plant(cache, mode=0o755)
    theirs = cache if whose == "compile_cache_dir" else cache / "triton"
    os.chown(theirs, NOBODY, NOBODY)

    message = refusal(str(cache))

    assert message.startswith(f"compile_cache_dir={str(cache)!r}: {str(theirs)!r} is owned by uid {NOBODY}")


def test_a_link_planted_at_its_triton_folder_is_refused(tmp_path: Path) -> None:
    """Planted while the cache was writable, and still there once its mode was fixed."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    cache = tmp_path / "vllm-cache"
    cache.mkdir(mode=0o700)
    (cache / "triton").symlink_to(theirs)

    message = refusal(str(cache))

    assert f"{str(cache / 'triton')!r} is a symbolic link" in message


def test_a_compile_cache_dir_under_a_folder_others_can_write_is_refused(tmp_path: Path) -> None:
    """Whoever may write the parent can rename the cache away and put their own in its place."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # no sticky bit, unlike /tmp
    cache = shared / "vllm-cache"

    message = refusal(str(cache))

    assert message.startswith(f"compile_cache_dir={str(cache)!r}: {str(shared)!r} (a folder above it) is "
                              "writable by its group or others without the sticky bit"), message  # fmt: skip
    assert not cache.exists()


def test_a_compile_cache_dir_under_a_sticky_folder_like_tmp_is_made_private(tmp_path: Path) -> None:
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    cache = sticky / "raybatch" / "vllm-cache"

    env = engine.checked_compile_cache_env(str(cache), {})

    assert env == {"VLLM_CACHE_ROOT": str(cache), "TRITON_CACHE_DIR": str(cache / "triton")}
    made = [sticky / "raybatch", cache, cache / "triton"]
    assert [oct(path.stat().st_mode & 0o777) for path in made] == [oct(0o700)] * 3


def test_triton_s_default_folder_is_refused_when_planted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unset, the replica names Triton's ~/.triton/cache itself (engine.compile_cache_env), so it checks it
    too: a home such as /tmp, where another local user made the folder first."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("HOME", str(home))
    triton = home / ".triton" / "cache"
    triton.mkdir(parents=True)
    triton.chmod(0o777)

    message = refusal(None)

    assert message.startswith(f"compile_cache_dir=None: {str(triton)!r} is writable by its group or others")


_REPLICA = """
import json, os, traceback
from ray.llm._internal.batch.stages.vllm_engine_stage import vLLMEngineStageUDF
from airflow_provider_raybatch.pipeline import run
from airflow_provider_raybatch.pipeline.generate import engine, engine_actor

os.environ[engine.FORKSERVER_ENV] = "0"  # no forkserver to start: no engine is built here

built = []
def build(self, *args, **kwargs):  # Ray Data LLM's UDF, which builds the engine: here it only records
    built.append({"VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT"),
                  "TRITON_CACHE_DIR": os.environ.get("TRITON_CACHE_DIR")})
    self.llm = type("Engine", (), {})()
vLLMEngineStageUDF.__init__ = build

report = {}
for name, cache_dir in CACHES.items():
    built.clear()
    try:
        engine_actor.RaybatchvLLMEngineStageUDF(
            data_column="__data", expected_input_keys=[], raybatch_staging=None,
            raybatch_compile_cache_dir=cache_dir, model="never-loaded")
    except Exception as err:
        # As Ray reports a replica that died in its constructor: its traceback, quoted.
        died = Exception("The actor died because of an error raised in its creation task, "
                         "ray::MapWorker(MapBatches(RaybatchvLLMEngineStageUDF)).__init__() (pid=1)\\n"
                         + "".join(traceback.format_exception(err)))
        report[name] = {"error": type(err).__name__, "built": list(built),
                        "job": str(run.EngineStageFailed(died))}
    else:
        report[name] = {"error": None, "built": list(built)}
print(json.dumps(report))
"""


def test_the_replica_refuses_a_planted_cache_before_its_engine_starts_and_the_job_says_why(
    tmp_path: Path,
) -> None:
    """The real replica UDF (a job's own replica; a warm pool's builds the same one), in the cluster's
    environment: a planted compile cache fails it before Ray Data LLM builds the engine, and the job's
    error leads with the refusal. A private one reaches the engine's environment."""
    plant(tmp_path / "theirs", mode=0o755)
    linked = tmp_path / "linked"
    linked.symlink_to(tmp_path / "theirs")
    writable = tmp_path / "writable"
    writable.mkdir()
    plant(writable, mode=0o777)
    private = tmp_path / "private"
    caches = {"linked": str(linked), "writable": str(writable), "private": str(private)}

    report = run_in_ray_env(f"CACHES = {json.dumps(caches)}\n{_REPLICA}")

    problems = {"linked": "is a symbolic link", "writable": "is writable by its group or others"}
    for name, problem in problems.items():
        refused, job = report[name], report[name].get("job", "")
        assert refused["error"] == "PrivateFolderError" and refused["built"] == [], refused
        why = f"compile_cache_dir={caches[name]!r}: {caches[name]!r} {problem}"
        assert job.startswith(f"The engine stage failed: PrivateFolderError: {why}"), job
        assert "A retry with the same settings fails the same way" in job
    assert report["private"] == {
        "error": None,
        "built": [{"VLLM_CACHE_ROOT": str(private), "TRITON_CACHE_DIR": str(private / "triton")}],
    }
    assert oct(private.stat().st_mode & 0o777) == oct(0o700)


@pytest.mark.parametrize("field", ["compile_cache_dir", "model_cache_dir"])
@pytest.mark.parametrize("value", ["/tmp/x/../vcache", "relative-cache", "~other/cache", "/ok/..", "../up"])
def test_a_cache_path_that_is_checked_as_one_folder_and_used_as_another_is_refused_at_parse(
    field: str, value: str
) -> None:
    """A '..' after another user's link: the check normalises the text, the kernel follows the link
    first. A relative path depends on the replica's working folder. Refused when the spec is built."""
    from pydantic import ValidationError

    from airflow_provider_raybatch.specs import BatchInferenceSpec

    with pytest.raises(ValidationError, match=rf"{field}=.* must be an absolute path .*no '\.\.' step"):
        BatchInferenceSpec(model="m", input_uri="/in.jsonl", output_uri="/out", user_template="{x}",
                           **{field: value})  # fmt: skip
    spec = BatchInferenceSpec(model="m", input_uri="/in.jsonl", output_uri="/out", user_template="{x}",
                              **{field: "~/caches/..dots-are-fine"})  # fmt: skip
    assert getattr(spec, field) == "~/caches/..dots-are-fine"
