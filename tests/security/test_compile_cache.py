"""A replica loads compiled code only from cache folders that are the Ray user's alone
(pipeline/generate/engine_caches.py, pipeline/private_folders.py).

vLLM loads its torch.compile graphs from its cache root (``VLLM_CACHE_ROOT``), Triton its kernels
from ``TRITON_CACHE_DIR`` and torch Inductor its code from ``TORCHINDUCTOR_CACHE_DIR``, and all three
run what they load in the replica. On a node other local users share, one of them could make such a
folder first, or a link at its name, or a folder above it they can write, and plant code there. So the
replica names every one of them itself, under ``compile_cache_dir`` or where its environment and the
libraries' defaults put them, and refuses a folder that is not the Ray user's alone before the engine
starts, naming the cache, where its path came from and the folder. A warm pool's replica looks again
at each attach: a folder deleted under it and made again by someone else ends it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_raybatch.pipeline.generate import engine_caches
from airflow_provider_raybatch.pipeline.private_folders import PrivateFolderError
from tests.unit.pipeline.ray_env import run_in_ray_env

pytestmark = pytest.mark.usefixtures("usual_umask")  # tests/security/conftest.py

#: What another local user plants: a kernel Triton would load and run in the replica.
PLANTED_KERNEL = b"\x7fELF a kernel of the planter's"
NOBODY = 65534
AS_ROOT = os.geteuid() == 0
#: How a refusal names a path from the replica's environment.
FROM_ENVIRONMENT = "set in the replica's environment: the node's or the job's runtime_env"


def plant(folder: Path, mode: int = 0o777) -> Path:
    """A compile cache folder as another local user leaves it: a kernel in Triton's folder."""
    (folder / "triton" / "k").mkdir(parents=True, exist_ok=True)
    kernel = folder / "triton" / "k" / "kernel.so"
    kernel.write_bytes(PLANTED_KERNEL)
    folder.chmod(mode)
    return kernel


def theirs(folder: Path) -> Path:
    """A folder another local user made: theirs where this runs as root, else one they can write."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernel.so").write_bytes(PLANTED_KERNEL)
    folder.chmod(0o777)
    if AS_ROOT:
        os.chown(folder, NOBODY, NOBODY)
    return folder


def shared_tmp(tmp_path: Path) -> Path:
    """A /tmp look-alike: every local user may make folders in it, and rename only their own."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    return shared


def refusal(cache_dir: str | None, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(PrivateFolderError) as refused:
        engine_caches.checked_cache_folders(cache_dir, environ or {})
    return str(refused.value)


def env_of(cache_dir: str | None, environ: dict[str, str] | None = None) -> dict[str, str]:
    return engine_caches.environment(engine_caches.checked_cache_folders(cache_dir, environ or {}))


def vllm_root(cache: Path) -> str:
    """How a refusal of ``compile_cache_dir`` itself starts."""
    return f"vLLM's cache root (VLLM_CACHE_ROOT, from compile_cache_dir={str(cache)!r})"


# compile_cache_dir ---------------------------------------------------------------------------------


def test_a_link_planted_at_compile_cache_dir_is_refused(tmp_path: Path) -> None:
    planted = tmp_path / "theirs"
    planted.mkdir()
    kernel = plant(planted, mode=0o755)
    cache = tmp_path / "vllm-cache"
    cache.symlink_to(planted)

    message = refusal(str(cache))

    assert message.startswith(f"{vllm_root(cache)}: {str(cache)!r} is a symbolic link"), message
    assert kernel.read_bytes() == PLANTED_KERNEL and sorted(p.name for p in planted.iterdir()) == ["triton"]


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o775, 0o757, 0o722], ids=oct)
def test_a_compile_cache_dir_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    """Ours or not: whoever could write it could have planted a kernel, and one in a folder we own but
    left group-writable is as hard to tell from ours as any other."""
    cache = tmp_path / "vllm-cache"
    cache.mkdir()
    plant(cache, mode=mode)

    message = refusal(str(cache))

    assert message.startswith(
        f"{vllm_root(cache)}: {str(cache)!r} is writable by its group or others (mode {oct(mode)})"
    ), message
    assert "delete this one and let the next run make it again" in message


@pytest.mark.skipif(not AS_ROOT, reason="making a folder another user's needs root")
@pytest.mark.parametrize("whose", ["compile_cache_dir", "its triton folder", "its inductor folder"])
def test_a_folder_of_another_user_is_refused(tmp_path: Path, whose: str) -> None:
    cache = tmp_path / "vllm-cache"
    cache.mkdir()
    plant(cache, mode=0o755)
    (cache / "inductor").mkdir(mode=0o755)
    folder = {
        "compile_cache_dir": cache,
        "its triton folder": cache / "triton",
        "its inductor folder": cache / "inductor",
    }[whose]
    os.chown(folder, NOBODY, NOBODY)

    message = refusal(str(cache))

    given = f"compile_cache_dir={str(cache)!r}"
    what = {
        "compile_cache_dir": vllm_root(cache),
        "its triton folder": f"the Triton cache (TRITON_CACHE_DIR, under {given})",
        "its inductor folder": "torch Inductor's cache (TORCHINDUCTOR_CACHE_DIR, which the replica sets "
        f"under {given})",
    }[whose]
    assert message.startswith(f"{what}: {str(folder)!r} is owned by uid {NOBODY}"), message


def test_a_link_planted_at_its_triton_folder_is_refused(tmp_path: Path) -> None:
    """Planted while the cache was writable, and still there once its mode was fixed."""
    planted = tmp_path / "theirs"
    planted.mkdir()
    cache = tmp_path / "vllm-cache"
    cache.mkdir(mode=0o700)
    (cache / "triton").symlink_to(planted)

    message = refusal(str(cache))

    assert f"{str(cache / 'triton')!r} is a symbolic link" in message


def test_a_compile_cache_dir_under_a_folder_others_can_write_is_refused(tmp_path: Path) -> None:
    """Whoever may write the parent can rename the cache away and put their own in its place."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # no sticky bit, unlike /tmp
    cache = shared / "vllm-cache"

    message = refusal(str(cache))

    assert message.startswith(
        f"{vllm_root(cache)}: {str(shared)!r} (a folder above it) is "
        "writable by its group or others without the sticky bit"
    ), message
    assert not cache.exists()


def test_a_compile_cache_dir_under_a_sticky_folder_like_tmp_is_made_private(tmp_path: Path) -> None:
    cache = shared_tmp(tmp_path) / "raybatch" / "vllm-cache"

    env = env_of(str(cache))

    assert env == {
        "VLLM_CACHE_ROOT": str(cache),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
    }
    made = [cache.parent, cache, cache / "triton", cache / "inductor"]
    assert [oct(path.stat().st_mode & 0o777) for path in made] == [oct(0o700)] * 4


# compile_cache_dir unset: the node's folders and the libraries' defaults ----------------------------


def test_triton_s_default_folder_is_refused_when_planted_and_the_refusal_says_whose_default_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unset, the replica names Triton's ~/.triton/cache itself, so it checks it too: a home such as
    /tmp, where another local user made the folder first. The refusal says which cache and why that
    path, not ``compile_cache_dir=None``."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("HOME", str(home))
    triton = home / ".triton" / "cache"
    triton.mkdir(parents=True)
    triton.chmod(0o777)

    message = refusal(None)

    assert message.startswith(
        "the Triton cache (Triton's default ~/.triton/cache, compile_cache_dir being unset): "
        f"{str(triton)!r} is writable by its group or others"
    ), message
    assert "compile_cache_dir=None" not in message


@pytest.mark.parametrize("home_from", ["HOME", "XDG_CACHE_HOME"])
def test_vllm_s_default_cache_root_in_a_shared_folder_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home_from: str
) -> None:
    """A Ray user whose HOME (or XDG_CACHE_HOME) is /tmp: vLLM would load compiled graphs from
    /tmp/.cache/vllm, which another local user made first."""
    shared = shared_tmp(tmp_path)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    if home_from == "HOME":
        monkeypatch.setenv("HOME", str(shared))
        environ: dict[str, str] = {}
        planted = theirs(shared / ".cache")  # above vLLM's root: whoever owns it can swap the root
        what = "vLLM's cache root (vLLM's default ~/.cache/vllm, compile_cache_dir being unset)"
        problem = "(a folder above it) is "
    else:
        monkeypatch.setenv("HOME", str(home))
        environ = {"XDG_CACHE_HOME": str(shared / "xdg")}
        shared_cache = shared / "xdg"
        shared_cache.mkdir(mode=0o755)
        planted = theirs(shared_cache / "vllm")
        what = f"vLLM's cache root (vLLM's default $XDG_CACHE_HOME/vllm, XDG_CACHE_HOME {FROM_ENVIRONMENT})"
        problem = "is "

    message = refusal(None, environ)

    assert message.startswith(f"{what}: {str(planted)!r} {problem}"), message


@pytest.mark.parametrize("variable", ["TRITON_CACHE_DIR", "VLLM_CACHE_ROOT"])
def test_a_cache_folder_the_node_or_runtime_env_sets_is_checked_too(tmp_path: Path, variable: str) -> None:
    """The node's (or a DAG's runtime_env's) TRITON_CACHE_DIR or VLLM_CACHE_ROOT in a shared folder,
    made by another local user first."""
    planted = theirs(shared_tmp(tmp_path) / "cache")
    home = tmp_path / "home"
    home.mkdir(mode=0o700)

    message = refusal(None, {variable: str(planted), "HOME": str(home)})

    what = "the Triton cache" if variable == "TRITON_CACHE_DIR" else "vLLM's cache root"
    assert message.startswith(f"{what} ({variable}, {FROM_ENVIRONMENT}): {str(planted)!r} "), message
    assert (planted / "kernel.so").read_bytes() == PLANTED_KERNEL  # nothing of theirs is touched


@pytest.mark.parametrize("value", ["relative/triton", "~/triton", "/tmp/x/../triton", "/tmp/.."])
def test_a_triton_cache_dir_that_would_be_checked_as_one_folder_and_used_as_another_is_refused(
    value: str,
) -> None:
    """Triton reads TRITON_CACHE_DIR as it is: a relative one (``~`` too) is a folder of the replica's
    working folder, and a '..' after another user's link is resolved by the kernel first."""
    message = refusal(None, {"TRITON_CACHE_DIR": value})

    assert message.startswith(
        f"the Triton cache (TRITON_CACHE_DIR, {FROM_ENVIRONMENT}): {value!r} must be "
        "an absolute path with no '..' step"
    ), message


def test_the_node_s_own_folders_are_used_once_checked(tmp_path: Path) -> None:
    node = tmp_path / "node"

    env = env_of(None, {"VLLM_CACHE_ROOT": str(node / "vllm"), "TRITON_CACHE_DIR": str(node / "triton")})

    assert env == {
        "VLLM_CACHE_ROOT": str(node / "vllm"),
        "TRITON_CACHE_DIR": str(node / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(node / "vllm" / "inductor"),
    }
    made = [node, node / "vllm", node / "triton", node / "vllm" / "inductor"]
    assert [oct(path.stat().st_mode & 0o777) for path in made] == [oct(0o700)] * 4


def test_inductor_s_tmp_default_is_never_used_even_once_torch_filled_it_in(tmp_path: Path) -> None:
    """torch sets TORCHINDUCTOR_CACHE_DIR to ``<tempdir>/torchinductor_<user>`` itself the moment
    anything asks for it (importing vLLM does): a folder in /tmp another local user may have made.
    The replica points it at a folder under the checked root instead, whatever it held."""
    planted = theirs(shared_tmp(tmp_path) / "torchinductor_ray")
    cache = tmp_path / "vllm-cache"

    env = env_of(str(cache), {"TORCHINDUCTOR_CACHE_DIR": str(planted)})

    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(cache / "inductor")


# engine_kwargs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["/tmp/planted", "~/graphs", "relative", "/srv/cache/../x"])
def test_a_compile_cache_folder_set_through_engine_kwargs_is_refused_at_parse(value: str) -> None:
    """vLLM's ``compilation_config.cache_dir`` would have it load compiled graphs from a folder the
    replica never checked."""
    from pydantic import ValidationError

    from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

    with pytest.raises(
        ValidationError,
        match=r"engine_kwargs\['compilation_config'\]\['cache_dir'\]=.* is "
        r"not allowed.*Set compile_cache_dir instead",
    ):
        BatchInferenceSpec(
            model="m",
            input_uri="/in.jsonl",
            output_uri="/out",
            user_template="{x}",
            engine_kwargs={"compilation_config": {"mode": 3, "cache_dir": value}},
        )
    spec = BatchInferenceSpec(
        model="m",
        input_uri="/in.jsonl",
        output_uri="/out",
        user_template="{x}",
        engine_kwargs={"compilation_config": {"mode": 3, "cache_dir": ""}},
    )
    assert spec.engine_kwargs["compilation_config"] == {"mode": 3, "cache_dir": ""}  # vLLM's default: fine


@pytest.mark.parametrize("field", ["compile_cache_dir", "model_cache_dir"])
@pytest.mark.parametrize("value", ["/tmp/x/../vcache", "relative-cache", "~other/cache", "/ok/..", "../up"])
def test_a_cache_path_that_is_checked_as_one_folder_and_used_as_another_is_refused_at_parse(
    field: str, value: str
) -> None:
    """A '..' after another user's link: the check normalises the text, the kernel follows the link
    first. A relative path depends on the replica's working folder. Refused when the spec is built."""
    from pydantic import ValidationError

    from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

    with pytest.raises(ValidationError, match=rf"{field}=.* must be an absolute path .*no '\.\.' step"):
        BatchInferenceSpec(
            model="m", input_uri="/in.jsonl", output_uri="/out", user_template="{x}", **{field: value}
        )
    spec = BatchInferenceSpec(
        model="m",
        input_uri="/in.jsonl",
        output_uri="/out",
        user_template="{x}",
        **{field: "~/caches/..dots-are-fine"},
    )
    assert getattr(spec, field) == "~/caches/..dots-are-fine"


# The real replica, in the cluster's environment ----------------------------------------------------

_REPLICA = """
import getpass, os, traceback
# Before torch is imported: its Inductor default, <tempdir>/torchinductor_<user>, is in this /tmp
# look-alike, where another local user made that folder first.
os.environ["TMPDIR"] = SHARED
PLANTED_INDUCTOR = os.path.join(SHARED, "torchinductor_" + getpass.getuser())
os.makedirs(PLANTED_INDUCTOR)
os.chmod(PLANTED_INDUCTOR, 0o777)
if os.geteuid() == 0:
    os.chown(PLANTED_INDUCTOR, 65534, 65534)

from ray.llm._internal.batch.stages.vllm_engine_stage import vLLMEngineStageUDF
from torch._inductor.runtime import cache_dir_utils
from airflow_provider_raybatch.pipeline import run
from airflow_provider_raybatch.pipeline.generate import engine, engine_actor

os.environ[engine.FORKSERVER_ENV] = "0"  # no forkserver to start: no engine is built here
VARIABLES = ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")

built = []
def build(self, *args, **kwargs):  # Ray Data LLM's UDF, which builds the engine: here it only records
    seen = {name: os.environ.get(name) for name in VARIABLES}
    seen["inductor_uses"] = cache_dir_utils.cache_dir()  # where Inductor would load its code from now
    built.append(seen)
    self.llm = type("Engine", (), {})()
vLLMEngineStageUDF.__init__ = build

imported = dict(os.environ)
report = {"torch_filled_in": imported.get("TORCHINDUCTOR_CACHE_DIR"), "planted": PLANTED_INDUCTOR}
for name, case in CASES.items():
    built.clear()
    os.environ.clear()
    os.environ.update(imported)
    os.environ.update(case["env"])
    try:
        engine_actor.RaybatchvLLMEngineStageUDF(
            data_column="__data", expected_input_keys=[], raybatch_staging=None,
            raybatch_compile_cache_dir=case["cache_dir"], model="never-loaded")
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


@pytest.fixture(scope="module")
def replica_report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The real replica UDF (a job's own replica; a warm pool's builds the same one), built once per
    case in one interpreter of the cluster's environment, Ray Data LLM's engine build replaced by a
    record of what the engine would have found."""
    old_umask = os.umask(0o022)
    try:
        tmp = tmp_path_factory.mktemp("replica")
        shared = shared_tmp(tmp)
        home = tmp / "home"
        home.mkdir(mode=0o700)
        plant(tmp / "planted", mode=0o755)
        (tmp / "linked").symlink_to(tmp / "planted")
        (tmp / "writable").mkdir()
        plant(tmp / "writable", mode=0o777)
        theirs(shared / ".cache")
        theirs(shared / "node-triton")
        folders = {
            "shared": str(shared),
            "home": str(home),
            "linked": str(tmp / "linked"),
            "writable": str(tmp / "writable"),
            "private": str(tmp / "private"),
        }
        cases = {
            "private": {"cache_dir": folders["private"], "env": {"HOME": str(home)}},
            "unset": {"cache_dir": None, "env": {"HOME": str(home)}},
            "linked": {"cache_dir": folders["linked"], "env": {"HOME": str(home)}},
            "writable": {"cache_dir": folders["writable"], "env": {"HOME": str(home)}},
            "home_in_tmp": {"cache_dir": None, "env": {"HOME": str(shared)}},
            "node_triton": {
                "cache_dir": None,
                "env": {"HOME": str(home), "TRITON_CACHE_DIR": str(shared / "node-triton")},
            },
        }
        code = f"import json\nSHARED = {str(shared)!r}\nCASES = json.loads({json.dumps(cases)!r})\n{_REPLICA}"
        report = run_in_ray_env(code)
        yield {"report": report, "folders": folders}
    finally:
        os.umask(old_umask)


def test_the_replica_names_every_cache_its_engine_loads_code_from_and_makes_each_private(
    replica_report: dict[str, Any],
) -> None:
    """Torch Inductor's /tmp default (filled in by the imports, planted by another user) is never the
    engine's, with compile_cache_dir or without; vLLM's cache root is named and made private too."""
    report, folders = replica_report["report"], replica_report["folders"]
    assert report["torch_filled_in"] == report["planted"]  # what the engine would otherwise use
    private, home = Path(folders["private"]), Path(folders["home"])
    assert report["private"] == {
        "error": None,
        "built": [
            {
                "VLLM_CACHE_ROOT": str(private),
                "TRITON_CACHE_DIR": str(private / "triton"),
                "TORCHINDUCTOR_CACHE_DIR": str(private / "inductor"),
                "inductor_uses": str(private / "inductor"),
            }
        ],
    }
    vllm = home / ".cache" / "vllm"
    assert report["unset"] == {
        "error": None,
        "built": [
            {
                "VLLM_CACHE_ROOT": str(vllm),
                "TRITON_CACHE_DIR": str(home / ".triton" / "cache"),
                "TORCHINDUCTOR_CACHE_DIR": str(vllm / "inductor"),
                "inductor_uses": str(vllm / "inductor"),
            }
        ],
    }
    made = [private, private / "triton", private / "inductor", vllm, vllm / "inductor", home / ".triton"]
    assert [oct(path.stat().st_mode & 0o777) for path in made] == [oct(0o700)] * len(made)


def test_the_replica_refuses_a_planted_cache_before_its_engine_starts_and_the_job_says_which_and_why(
    replica_report: dict[str, Any],
) -> None:
    """A planted folder fails the real replica UDF before Ray Data LLM builds the engine, and the job's
    error leads with the refusal: which cache, where its path came from, the folder and what is wrong."""
    report, folders = replica_report["report"], replica_report["folders"]
    shared = Path(folders["shared"])
    refusals = {
        "linked": f"{vllm_root(Path(folders['linked']))}: {folders['linked']!r} is a symbolic link",
        "writable": f"{vllm_root(Path(folders['writable']))}: {folders['writable']!r} is writable by its "
        "group or others",
        "home_in_tmp": "vLLM's cache root (vLLM's default ~/.cache/vllm, compile_cache_dir being unset): "
        f"{str(shared / '.cache')!r} (a folder above it) is ",
        "node_triton": f"the Triton cache (TRITON_CACHE_DIR, {FROM_ENVIRONMENT}): "
        f"{str(shared / 'node-triton')!r} ",
    }
    jobs = {name: report[name].get("job", "the replica was built") for name in refusals}
    assert {
        name: job.startswith(f"The engine stage failed: PrivateFolderError: {refusals[name]}")
        for name, job in jobs.items()
    } == dict.fromkeys(refusals, True), jobs
    assert all(report[name]["built"] == [] for name in refusals)  # refused before the engine build
    assert all("A retry with the same settings fails the same way" in job for job in jobs.values())


# A warm pool's replica: a folder replaced under it ------------------------------------------------

_WARM_REPLICA = """
import json, os, shutil, time
import ray
from airflow_provider_raybatch.pipeline import run
from airflow_provider_raybatch.pipeline.generate import engine, pool_replica
from airflow_provider_raybatch.pipeline.generate.pool_replica import EngineReplica

class Replica(EngineReplica):  # the replica's own code; only Ray Data LLM's engine build is stubbed
    def __init__(self, cache_dir):
        from ray.llm._internal.batch.stages.vllm_engine_stage import vLLMEngineStageUDF

        def build(udf, *args, **kwargs):
            udf.llm = type("Engine", (), {})()
        vLLMEngineStageUDF.__init__ = build
        os.environ[engine.FORKSERVER_ENV] = "0"
        super().__init__({"model": "never-loaded"}, cache_dir, "f", keep_warm_seconds=60.0)

ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")
groups = {pool_replica.CONTROL_GROUP: pool_replica.CONTROL_CALLS}  # as engine_pool makes a replica
replica = ray.remote(concurrency_groups=groups)(Replica).options(max_concurrency=8).remote(CACHE)
report = {"first": ray.get(replica.attach.remote("job-a", 60.0), timeout=120)["jobs_served"]}
# A tmp cleaner deletes the folder under the live replica: the next look makes it again, the Ray user's.
shutil.rmtree(CACHE)
report["renewed"] = ray.get(replica.attach.remote("job-a", 60.0), timeout=30)["jobs_served"]
report["remade_mode"] = oct(os.stat(CACHE).st_mode & 0o777) if os.path.exists(CACHE) else None
# Deleted again, and this time another local user makes it first, a kernel of theirs inside.
shutil.rmtree(CACHE, ignore_errors=True)
os.makedirs(os.path.join(CACHE, "triton", "k"))
with open(os.path.join(CACHE, "triton", "k", "kernel.so"), "wb") as kernel:
    kernel.write(b"theirs")
for folder, _, files in os.walk(CACHE):
    os.chmod(folder, 0o755)
    os.chown(folder, 65534, 65534)
try:
    ray.get(replica.attach.remote("job-b", 60.0), timeout=30)
    report["second"] = "attached"
except ray.exceptions.RayTaskError as err:
    report["second"] = type(err.cause).__name__
    report["job"] = str(run.EngineStageFailed(err))
deadline = time.monotonic() + 30
report["ended"] = False
while time.monotonic() < deadline and not report["ended"]:
    try:
        ray.get(replica.__ray_ready__.remote(), timeout=5)
        time.sleep(0.2)
    except ray.exceptions.RayActorError:
        report["ended"] = True
print(json.dumps(report))
"""


@pytest.mark.skipif(not AS_ROOT, reason="making a folder another user's needs root")
def test_a_cache_folder_remade_by_another_user_under_a_warm_replica_ends_it_at_the_next_attach(
    tmp_path: Path,
) -> None:
    """A warm replica lives for hours: a folder of its cache deleted under it (a tmp cleaner) and made
    again by another local user is refused at the next attach, whose job fails saying so, and the
    replica ends (a fresh one would be refused alike). Deleted and not re-made, it is made again,
    private, and the replica goes on."""
    cache = tmp_path / "tmp" / "vllm-cache"
    cache.parent.mkdir()
    cache.parent.chmod(0o1777)

    report = run_in_ray_env(f"CACHE = {str(cache)!r}\n{_WARM_REPLICA}")

    assert report["second"] == "PrivateFolderError", report
    assert (report["first"], report["renewed"], report["remade_mode"]) == (0, 1, oct(0o700))
    why = f"{vllm_root(cache)}: {str(cache)!r} is owned by uid {NOBODY}"
    assert report["job"].startswith(f"The engine stage failed: PrivateFolderError: {why}"), report["job"]
    assert report["ended"] is True
