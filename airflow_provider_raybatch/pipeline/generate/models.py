"""Model sources: a Hugging Face id or a local folder go to vLLM as they are; so does an s3://
prefix when the job relies on the cluster's own credentials (Ray Data LLM fetches it on each
engine's node, which suits an autoscaling GPU group).

With S3 settings shipped with the job (pipeline/credentials.py: a custom endpoint, keys from an
Airflow connection), Ray Data LLM cannot use them (it reads each node's environment), so the model
is fetched here first, onto every node alive at the start, into ``cache_dir``: one private copy per
endpoint, URI and version of the objects (:mod:`.model_cache`), checked against the bucket's listing
before each run, so a daily run fetches only when the model changed. Nodes that join later lack it:
with an autoscaling GPU group, give the cluster an IAM role instead.
"""

from __future__ import annotations

import errno
import logging
import os
import posixpath
import re
import shutil
import tempfile
import uuid

from airflow_provider_raybatch.pipeline import private_folders, storage
from airflow_provider_raybatch.pipeline.generate import model_cache
from airflow_provider_raybatch.pipeline.generate.model_cache import ModelCacheError, ModelObject
from airflow_provider_raybatch.shared.json_types import JsonValue

log = logging.getLogger("airflow_provider_raybatch.pipeline")
#: The constructor keyword of each stage that loads the model (and of a pool replica's chat template):
#: the ``model_cache_dir`` of the copy the driver fetched, checked before loading (unset: no copy).
MODEL_COPY_KWARG = "raybatch_model_copy_root"
#: A copy's folder name in a source's folder (model_cache.objects_digest).
_COPY_NAME = re.compile(r"[0-9a-f]{16}")
#: How often a fetch tries to put its copy in place of a stale one that concurrent fetches keep replacing.
_PLACE_ATTEMPTS = 3

__all__ = [
    "MODEL_COPY_KWARG",
    "ModelCacheError",
    "check_copy_in_replica",
    "fetch_model",
    "local_model_dir",
    "resolve_model_source",
]


def local_model_dir(model_uri: str, cache_dir: str) -> str:
    """The folder that holds a node's copies of an s3:// model as this process reaches it (the same path
    on every node): named by the URI and the S3 endpoint and region (storage.s3_options)."""
    key = model_cache.source_key(model_uri, storage.s3_options())[:16]
    return posixpath.join(
        posixpath.expanduser(cache_dir), f"{posixpath.basename(model_uri.rstrip('/'))}-{key}"
    )


def fetch_model(
    model_uri: str, target: str, objects: list[ModelObject] | None = None, cache_dir: str | None = None
) -> int:
    """Make ``target`` a complete copy of the objects under ``model_uri`` as they are now; returns the
    number of files copied (0: the copy there was current).

    :param objects: the listing the caller named ``target`` after; the fetch fails if the bucket no
        longer holds exactly these.
    :param cache_dir: the cache's root: it and every folder below it down to ``target`` must be private
        to the Ray user (:func:`.private_folders.make_private_folders`); unset: ``target``'s parent.

    A copy is made in a fresh private sibling folder and renamed into place, so a crash never leaves a
    half model and a stale or forged copy is never served.
    """
    listed = model_cache.list_model_objects(model_uri)  # every key is checked before anything is made
    if not listed:
        raise FileNotFoundError(f"model={model_uri!r}: no files under that prefix.")
    if objects is not None and listed != objects:
        raise ModelCacheError(
            f"model={model_uri!r}: its objects changed since the job's driver listed them; run the task "
            "again once the upload is complete."
        )
    parent = posixpath.dirname(posixpath.abspath(target))
    setting = f"model_cache_dir={cache_dir or parent!r}"
    private_folders.make_private_folders(cache_dir or parent, parent, setting)
    if os.path.lexists(target):
        private_folders.check_private(target, setting)
        if model_cache.copy_matches(target, listed):
            return 0
    partial = tempfile.mkdtemp(prefix=f".{posixpath.basename(target)}.partial-", dir=parent)  # 0700
    try:
        _copy_objects(model_uri, listed, partial)
        if model_cache.list_model_objects(model_uri) != listed:
            raise ModelCacheError(
                f"model={model_uri!r}: its objects changed while they were fetched; run the task again "
                "once the upload is complete."
            )
        model_cache.write_marker(partial, model_uri, listed)
        _place(partial, target, listed, setting)
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # nothing half-copied stays in the cache
    return len(listed)


def _copy_objects(model_uri: str, objects: list[ModelObject], folder: str) -> None:
    """Each object into ``folder`` (private and ours: made by mkdtemp): folders 0700, files 0600."""
    filesystem, prefix = storage.filesystem(model_uri)
    for item in objects:
        local = _inside(folder, item.key, model_uri)
        _make_folders(folder, posixpath.dirname(item.key))
        with (
            filesystem.open_input_stream(f"{prefix.rstrip('/')}/{item.key}") as source,
            model_cache.open_new_private_file(local) as sink,
        ):
            shutil.copyfileobj(source, sink, length=8 << 20)
            size = sink.tell()
        if size != item.size:
            raise ModelCacheError(
                f"model={model_uri!r}: {item.key!r} held {size} bytes, not the {item.size} listed: it "
                "changed while it was fetched; run the task again once the upload is complete."
            )


def _make_folders(folder: str, relative: str) -> None:
    path = folder
    for step in filter(None, relative.split("/")):
        path = posixpath.join(path, step)
        if not posixpath.isdir(path):
            os.mkdir(path, 0o700)


def _place(partial: str, target: str, objects: list[ModelObject], setting: str) -> None:
    """Rename the complete copy ``partial`` to ``target``; a current copy already there (a concurrent
    fetch's) is kept, any other is moved aside and deleted.

    :param setting: the cache's, for a refusal (:func:`.private_folders.check_private`)."""
    for _ in range(_PLACE_ATTEMPTS):
        try:
            os.rename(partial, target)
            return
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        private_folders.check_private(target, setting)
        if model_cache.copy_matches(target, objects):
            return  # another fetch finished first: keep its copy
        stale = f"{target}.stale-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(target, stale)
        except FileNotFoundError:
            continue  # another fetch moved it aside first
        shutil.rmtree(stale, ignore_errors=True)
    raise ModelCacheError(f"Could not put the fetched model in place at {target!r}: it kept changing.")


def _inside(folder: str, relative: str, model_uri: str) -> str:
    """``folder``/``relative``, checked to resolve inside ``folder`` (links included) before any write."""
    local = posixpath.join(folder, relative)
    root = os.path.realpath(folder)
    if os.path.commonpath([root, os.path.realpath(local)]) != root:
        raise ValueError(f"model={model_uri!r}: the file {relative!r} would be written outside {folder!r}.")
    return local


def check_copy_in_replica(copy: str, cache_dir: str) -> None:
    """In an engine replica, before its engine loads ``copy``: the copy the driver fetched into
    ``cache_dir`` is on this node, private, and complete.

    The driver fetches and checks a copy on the nodes alive when the job starts; a replica may run on a
    node that joined since, or be rebuilt after a tmp cleaner emptied the cache, and would load whatever
    another local user put at that path (their code, with ``trust_remote_code``). The folders from
    ``cache_dir`` down must be the Ray user's alone, and the copy's marker must list files that are there
    at their sizes and be what the folder's name (its digest) says.

    :raises ModelCacheError: the copy is missing or not complete here.
    :raises private_folders.PrivateFolderError: a folder another local user made or can write.
    """
    setting = f"model_cache_dir={cache_dir!r}"
    if not os.path.lexists(copy):
        raise ModelCacheError(
            f"{setting}: the model's copy {copy!r} is not on this node: a node that joined the cluster "
            "after the job's driver fetched the model onto every node then alive, or a cleaner emptied the "
            "folder. Run the task again (its fetch reaches every node alive then); with an autoscaling "
            "GPU group, give the cluster an IAM role so that each engine's node fetches the model itself."
        )
    private_folders.make_private_folders(cache_dir, posixpath.dirname(copy), setting)
    private_folders.check_private(copy, setting)
    objects = model_cache.marked_objects(copy)
    if (
        objects is None
        or model_cache.objects_digest(objects) != posixpath.basename(copy)
        or not model_cache.copy_matches(copy, objects)
    ):
        raise ModelCacheError(
            f"{setting}: {copy!r} is not a complete copy of the model the job's driver fetched (its "
            "marker is missing, or lists other files than are there). Delete the folder; the next run "
            "fetches the model again."
        )


def _fetch_on_node(model_uri: str, target: str, objects: list[ModelObject], cache_dir: str) -> int:
    """One node's fetch (:func:`fetch_model`), then its other copies of the source go: they are of
    objects the bucket no longer holds."""
    copied = fetch_model(model_uri, target, objects, cache_dir)
    source_folder, name = posixpath.split(target)
    for other in os.listdir(source_folder):
        if other != name and _COPY_NAME.fullmatch(other):
            shutil.rmtree(posixpath.join(source_folder, other), ignore_errors=True)
    return copied


def resolve_model_source(model: str, cache_dir: str) -> str:
    """The model source to hand vLLM (see the module docstring)."""
    from airflow_provider_raybatch.pipeline.credentials import shipped_s3_settings

    if not model.startswith("s3://") or shipped_s3_settings() is None:
        storage.check_model_source(model)
        return model
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # Listed once here, so that every node fetches the same objects into the same folder.
    objects = model_cache.list_model_objects(model)
    if not objects:
        raise FileNotFoundError(f"model={model!r}: no files under that prefix.")
    cache_dir = posixpath.expanduser(cache_dir)
    if not posixpath.isabs(cache_dir):  # "~" stays as it is where HOME is unset (an arbitrary uid)
        raise model_cache.ModelCacheError(
            f"model_cache_dir={cache_dir!r} (HOME={posixpath.expanduser('~')!r} for the Ray user): set "
            "model_cache_dir to an absolute folder the Ray user owns."
        )
    target = posixpath.join(local_model_dir(model, cache_dir), model_cache.objects_digest(objects))
    fetch = ray.remote(num_cpus=0)(_fetch_on_node)
    nodes = [node["NodeID"] for node in ray.nodes() if node.get("Alive")]
    copied: list[JsonValue] = ray.get(  # what each node copied
        [
            fetch.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
                model, target, objects, cache_dir
            )
            for node in nodes
        ]
    )
    log.info("Model %s is at %s on %d node(s); files fetched: %s.", model, target, len(nodes), copied)
    storage.check_model_source(target)
    return target
