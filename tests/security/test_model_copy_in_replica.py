"""An engine replica builds its engine on a fetched model copy only once it has checked that copy itself.

The job's driver fetches an S3 model into ``model_cache_dir`` on the nodes alive when the job starts
and checks each copy there (pipeline/generate/models.py). A replica placed on a node that joined later,
or a warm pool's replica rebuilt after a tmp cleaner emptied ``/tmp``, finds whatever folder stands at
the copy's path on its own node: with ``model_cache_dir`` in a shared sticky folder, another local user
could have made it first, with a model of theirs (code, with ``trust_remote_code``). So the replica
checks the copy as the fetch does, before vLLM sees it: the folders from ``model_cache_dir`` down are the
Ray user's alone, and the copy is complete (its marker lists files that are there, at their sizes) and
is the one the driver named (its folder's name is the digest of what the marker lists).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.pipeline.ray_env import run_in_ray_env

pytestmark = pytest.mark.usefixtures("usual_umask")  # tests/security/conftest.py

#: The snippet: the real replica UDF (Ray Data LLM's engine build stubbed to record what vLLM would
#: load) built on a copy path under a /tmp look-alike, in each of the cases below.
_BUILD_ON_COPY = """
import json, os
from airflow_provider_raybatch.pipeline.generate import engine, engine_actor, model_cache
from airflow_provider_raybatch.pipeline.generate.model_cache import ModelObject
from ray.llm._internal.batch.stages.vllm_engine_stage import vLLMEngineStageUDF

os.environ[engine.FORKSERVER_ENV] = "0"
loaded = []

def build(self, *args, **kwargs):
    loaded.append(kwargs.get("model"))
    self.llm = type("Engine", (), {})()
vLLMEngineStageUDF.__init__ = build

objects = [ModelObject(key="config.json", size=2, etag="e1")]
cache = os.path.join(SHARED, "raybatch-models")
copy = os.path.join(cache, "tiny-0123456789abcdef", model_cache.objects_digest(objects))

def make_copy(owner=None):
    os.makedirs(copy, mode=0o700)
    for folder in (cache, os.path.dirname(copy), copy):
        os.chmod(folder, 0o700)
    with open(os.path.join(copy, "config.json"), "w") as sink:
        sink.write("{}")
    model_cache.write_marker(copy, "s3://models/tiny", objects)
    if owner is not None:  # another local user made it first
        for folder in (cache, os.path.dirname(copy), copy):
            os.chown(folder, owner, owner)
            os.chmod(folder, 0o777)

def attempt(case):
    loaded.clear()
    try:
        engine_actor.RaybatchvLLMEngineStageUDF(
            data_column="__data", expected_input_keys=[], raybatch_staging=None,
            raybatch_compile_cache_dir=os.path.join(SHARED, "compile"), raybatch_model_copy_root=cache,
            model=copy)
        refused = None
    except Exception as err:
        refused = f"{type(err).__name__}: {err}"
    report[case] = {"built_on": list(loaded), "refused": refused}

report = {}
import shutil
attempt("missing")
make_copy(owner=12345)
attempt("another_users")
shutil.rmtree(cache)
make_copy()
os.remove(os.path.join(copy, "config.json"))
attempt("incomplete")
shutil.rmtree(cache)
make_copy()
attempt("own")
print(json.dumps(report))
"""


@pytest.mark.timeout(300)
def test_a_replica_builds_only_on_a_model_copy_it_checked(tmp_path: Path) -> None:
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)

    report = run_in_ray_env(f"SHARED = {str(shared)!r}\n{_BUILD_ON_COPY}")

    copy_path = report["own"]["built_on"]
    assert report["own"]["refused"] is None and len(copy_path) == 1, report["own"]
    for case, why in (
        ("missing", "not on this node"),
        ("another_users", "owned by uid 12345"),
        ("incomplete", "not a complete copy"),
    ):
        assert report[case]["built_on"] == [], (case, report[case])
        refused = report[case]["refused"] or ""
        assert why in refused and "model_cache_dir=" in refused, (case, refused)
