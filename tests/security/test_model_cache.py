"""The model cache (pipeline/generate/models.py) serves only what the bucket holds now, and keeps it private.

A job that ships its own S3 settings (``aws_conn_id``) fetches an ``s3://`` model onto every node,
into ``model_cache_dir`` (default ``~/.cache/raybatch/models``), and vLLM loads it from there, code
included with ``trust_remote_code``. So:

* a folder another local user made at the cache's or the model's path first (world- or
  group-writable, a link, another owner) is never used: the job fails naming the path;
* a copy is used only when the bucket's objects (key, size, ETag), listed again, are the ones its
  completion marker records: a forged marker, a changed or a removed object, a bucket that cannot be
  listed serve nothing stale or planted;
* two deployments whose S3 endpoints differ get different copies of one URI, and different warm
  engine pools;
* weights fetched with private credentials are the Ray user's alone (files 0600, folders 0700).

The bucket is a real S3-compatible server on loopback (moto, tests/conftest.py ``s3_server``); Ray is
a stand-in that runs each node's fetch in this process (one node), so no cluster starts.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import types
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_raybatch.pipeline import credentials, storage
from airflow_provider_raybatch.pipeline.generate import model_cache, models
from airflow_provider_raybatch.pipeline.generate.engine_pool import pool_fingerprint
from airflow_provider_raybatch.shared.specs import DEFAULT_MODEL_CACHE_DIR

pytestmark = pytest.mark.usefixtures("usual_umask")  # tests/security/conftest.py

BUCKET = "raybatch-model-cache"
MODEL_FILES = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"]}',
    "model.safetensors": bytes(range(256)) * 64,
    "tokenizer/tokenizer.json": b'{"version": "1.0"}',
}
PLANTED_CONFIG = b'{"auto_map": {"AutoModel": "evil.Model"}}'


@dataclass(frozen=True)
class BucketModel:
    client: Any  # Any: a boto3 S3 client
    bucket: str
    prefix: str
    endpoint_url: str

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def put(self, name: str, body: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=f"{self.prefix}/{name}", Body=body)


def ship_settings(monkeypatch: pytest.MonkeyPatch, s3_server: Any, endpoint_url: str) -> None:
    """This process holds the S3 settings a job with ``aws_conn_id`` ships (pipeline/credentials.py)."""
    settings = {
        "endpoint_url": endpoint_url,
        "region": "us-east-1",
        "access_key": s3_server.access_key,
        "secret_key": s3_server.secret_key,
    }
    monkeypatch.setattr(credentials, "_settings", settings)
    monkeypatch.setattr(storage, "_s3_options", None)  # built again from the settings above


@pytest.fixture
def model(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> BucketModel:
    """A model under a fresh prefix of a bucket on the loopback server, and the job's settings for it."""
    client = s3_server.client()
    if BUCKET not in {bucket["Name"] for bucket in client.list_buckets()["Buckets"]}:
        client.create_bucket(Bucket=BUCKET)
    bucket_model = BucketModel(client, BUCKET, f"m-{uuid.uuid4().hex[:8]}", s3_server.endpoint_url)
    for name, body in MODEL_FILES.items():
        bucket_model.put(name, body)
    ship_settings(monkeypatch, s3_server, s3_server.endpoint_url)
    return bucket_model


@pytest.fixture(autouse=True)
def one_node_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in for the parts of Ray that resolve_model_source uses: one live node, whose fetch runs
    here at once."""

    class Remote:
        def __init__(self, function: Any) -> None:  # Any: the remote function
            self.function = function

        def options(self, **_: Any) -> Remote:  # Any: Ray's task options
            return self

        def remote(self, *args: Any) -> Any:  # Any: the function's arguments and result
            return self.function(*args)

    ray = types.ModuleType("ray")
    ray.remote = lambda **_: Remote  # type: ignore[attr-defined]
    ray.nodes = lambda: [{"NodeID": "node-1", "Alive": True}]  # type: ignore[attr-defined]
    ray.get = lambda refs: list(refs)  # type: ignore[attr-defined]
    util = types.ModuleType("ray.util")
    strategies = types.ModuleType("ray.util.scheduling_strategies")
    strategies.NodeAffinitySchedulingStrategy = lambda *args, **kwargs: None  # type: ignore[attr-defined]
    for name, module in {"ray": ray, "ray.util": util, "ray.util.scheduling_strategies": strategies}.items():
        monkeypatch.setitem(sys.modules, name, module)


def files_under(folder: Path) -> dict[str, bytes]:
    return {
        path.relative_to(folder).as_posix(): path.read_bytes()
        for path in folder.rglob("*")
        if path.is_file() and not path.name.startswith(".raybatch")
    }


def plant(folder: Path, config: bytes = PLANTED_CONFIG, mode: int = 0o700) -> None:
    """A complete-looking model copy: a completion marker and a config.json of the planter's."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_bytes(config)
    (folder / "evil.py").write_bytes(b"import os; os.system('id')")
    (folder / model_cache.COMPLETE_MARKER).write_bytes(b"")
    folder.chmod(mode)


# -- folders another local user made first ---------------------------------------------------------


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o757, 0o722], ids=oct)
def test_a_cache_dir_others_can_write_is_refused(model: BucketModel, tmp_path: Path, mode: int) -> None:
    cache = tmp_path / "cache"
    plant(Path(models.local_model_dir(model.uri, str(cache))))
    cache.chmod(mode)

    with pytest.raises(RuntimeError, match="writable") as refused:
        models.resolve_model_source(model.uri, str(cache))

    assert str(cache) in str(refused.value) and "model_cache_dir" in str(refused.value)


def test_a_cache_dir_under_a_folder_others_can_write_is_refused(model: BucketModel, tmp_path: Path) -> None:
    """Whoever may write the parent can rename the cache away and put their own in its place."""
    shared = tmp_path / "shared"
    cache = shared / "models"
    cache.mkdir(parents=True)
    shared.chmod(0o777)  # no sticky bit, unlike /tmp

    with pytest.raises(RuntimeError, match="writable") as refused:
        models.resolve_model_source(model.uri, str(cache))

    assert str(shared) in str(refused.value)


def test_a_cache_dir_under_a_sticky_folder_like_tmp_is_fine(model: BucketModel, tmp_path: Path) -> None:
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)

    local = models.resolve_model_source(model.uri, str(sticky / "raybatch" / "models"))

    assert files_under(Path(local)) == MODEL_FILES


def test_a_linked_cache_dir_is_refused(model: BucketModel, tmp_path: Path) -> None:
    elsewhere = tmp_path / "someone-elses"
    plant(Path(models.local_model_dir(model.uri, str(elsewhere))))
    cache = tmp_path / "cache"
    cache.symlink_to(elsewhere)

    with pytest.raises(RuntimeError, match="link") as refused:
        models.resolve_model_source(model.uri, str(cache))

    assert str(cache) in str(refused.value)


def test_a_linked_model_folder_is_refused(model: BucketModel, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    elsewhere = tmp_path / "someone-elses"
    plant(elsewhere)
    Path(models.local_model_dir(model.uri, str(cache))).symlink_to(elsewhere)

    with pytest.raises(RuntimeError, match="link"):
        models.resolve_model_source(model.uri, str(cache))

    assert (elsewhere / "config.json").read_bytes() == PLANTED_CONFIG  # nothing written through the link


def test_a_model_folder_others_can_write_is_refused(model: BucketModel, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    planted = Path(models.local_model_dir(model.uri, str(cache)))
    plant(planted, mode=0o777)

    with pytest.raises(RuntimeError, match="writable") as refused:
        models.resolve_model_source(model.uri, str(cache))

    assert str(planted) in str(refused.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder another user's needs root")
@pytest.mark.parametrize("whose", ["cache", "model folder"])
def test_a_folder_of_another_user_is_refused(model: BucketModel, tmp_path: Path, whose: str) -> None:
    cache = tmp_path / "cache"
    planted = Path(models.local_model_dir(model.uri, str(cache)))
    plant(planted)
    nobody = 65534
    os.chown(cache if whose == "cache" else planted, nobody, nobody)

    with pytest.raises(RuntimeError, match="owned by uid 65534") as refused:
        models.resolve_model_source(model.uri, str(cache))

    assert str(cache if whose == "cache" else planted) in str(refused.value)


# -- a copy is used only when it is what the bucket holds now --------------------------------------


def test_a_forged_completion_marker_is_not_served(model: BucketModel, tmp_path: Path) -> None:
    target = tmp_path / "cache" / "m"
    plant(target)
    (target / model_cache.COMPLETE_MARKER).write_text(
        json.dumps({"objects": [{"key": "config.json", "size": len(PLANTED_CONFIG), "etag": '"forged"'}]})
    )

    assert models.fetch_model(model.uri, str(target)) == len(MODEL_FILES)

    assert files_under(target) == MODEL_FILES


def test_a_copy_whose_marker_matches_but_whose_files_do_not_is_fetched_again(
    model: BucketModel, tmp_path: Path
) -> None:
    """A marker copied from a good fetch, beside files of another size: the files are checked too."""
    target = tmp_path / "cache" / "m"
    models.fetch_model(model.uri, str(target))
    (target / "config.json").chmod(0o600)
    (target / "config.json").write_bytes(PLANTED_CONFIG)

    assert models.fetch_model(model.uri, str(target)) == len(MODEL_FILES)

    assert files_under(target) == MODEL_FILES


def test_a_changed_object_is_fetched_again(model: BucketModel, tmp_path: Path) -> None:
    target = tmp_path / "cache" / "m"
    assert models.fetch_model(model.uri, str(target)) == len(MODEL_FILES)
    assert models.fetch_model(model.uri, str(target)) == 0  # unchanged: served from the cache
    model.put("config.json", b'{"architectures": ["Qwen2ForCausalLM"]}')  # a new ETag

    assert models.fetch_model(model.uri, str(target)) == len(MODEL_FILES)

    assert (target / "config.json").read_bytes() == b'{"architectures": ["Qwen2ForCausalLM"]}'


def test_a_changed_model_gets_a_new_folder_and_new_warm_engines(model: BucketModel, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    before = models.resolve_model_source(model.uri, str(cache))
    model.put("config.json", b'{"architectures": ["Qwen2ForCausalLM"]}')

    after = models.resolve_model_source(model.uri, str(cache))

    assert files_under(Path(after))["config.json"] == b'{"architectures": ["Qwen2ForCausalLM"]}'
    assert pool_fingerprint({"model": after}, {}, None) != pool_fingerprint({"model": before}, {}, None)


def test_a_model_removed_from_the_bucket_is_not_served(model: BucketModel, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    models.resolve_model_source(model.uri, str(cache))
    for name in MODEL_FILES:
        model.client.delete_object(Bucket=model.bucket, Key=f"{model.prefix}/{name}")

    with pytest.raises(FileNotFoundError, match=model.prefix):
        models.resolve_model_source(model.uri, str(cache))


def test_a_model_whose_bucket_cannot_be_listed_is_not_served(model: BucketModel, tmp_path: Path) -> None:
    bucket = f"gone-{uuid.uuid4().hex[:8]}"
    model.client.create_bucket(Bucket=bucket)
    for name, body in MODEL_FILES.items():
        model.client.put_object(Bucket=bucket, Key=f"m/{name}", Body=body)
    cache = tmp_path / "cache"
    models.resolve_model_source(f"s3://{bucket}/m", str(cache))
    for name in MODEL_FILES:
        model.client.delete_object(Bucket=bucket, Key=f"m/{name}")
    model.client.delete_bucket(Bucket=bucket)

    with pytest.raises((RuntimeError, OSError), match=f"s3://{bucket}/m"):
        models.resolve_model_source(f"s3://{bucket}/m", str(cache))


# -- two deployments under one URI -------------------------------------------------------------------


def test_two_endpoints_under_one_uri_get_their_own_copies_and_pools(
    model: BucketModel, s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two deployments name one URI on two S3 servers (here one server under two names)."""
    cache = tmp_path / "cache"
    first = models.resolve_model_source(model.uri, str(cache))
    other_endpoint = model.endpoint_url.replace("127.0.0.1", "localhost")
    ship_settings(monkeypatch, s3_server, other_endpoint)

    second = models.resolve_model_source(model.uri, str(cache))

    assert first != second
    assert files_under(Path(first)) == files_under(Path(second)) == MODEL_FILES
    assert pool_fingerprint({"model": first}, {}, None) != pool_fingerprint({"model": second}, {}, None)
    assert s3_server.secret_key not in second and s3_server.access_key not in second


# -- the copy is the Ray user's alone ----------------------------------------------------------------


def test_a_fetched_model_is_private(model: BucketModel, tmp_path: Path) -> None:
    cache = tmp_path / "cache"

    local = Path(models.resolve_model_source(model.uri, str(cache)))

    assert files_under(local) == MODEL_FILES
    folders = [cache, *(path for path in cache.rglob("*") if path.is_dir())]
    files = [path for path in cache.rglob("*") if path.is_file()]
    assert local in folders and len(files) > len(MODEL_FILES)  # the marker too
    assert {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in folders} == {
        str(p): oct(0o700) for p in folders
    }
    assert {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {str(p): oct(0o600) for p in files}
    assert {p.stat().st_uid for p in [*folders, *files]} == {os.geteuid()}


def test_the_default_cache_is_in_the_ray_users_home_and_private(
    model: BucketModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not under /tmp: a local user who made /tmp/raybatch first would own it, and the owner check
    would then refuse every job's cache there."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("HOME", str(home))

    local = Path(models.resolve_model_source(model.uri, DEFAULT_MODEL_CACHE_DIR))

    cache = home / ".cache" / "raybatch" / "models"
    assert local.is_relative_to(cache) and files_under(local) == MODEL_FILES
    assert oct(stat.S_IMODE(cache.stat().st_mode)) == oct(0o700)


def test_a_cache_dir_that_is_not_absolute_after_expanding_home_is_refused(model: BucketModel) -> None:
    """Where HOME is unset (an arbitrary uid in a container) ``~`` stays as it is: each process would
    resolve the cache against its own working folder."""
    with pytest.raises(model_cache.ModelCacheError, match="model_cache_dir='relative/models'"):
        models.resolve_model_source(model.uri, "relative/models")
