"""Model sources: a Hugging Face id or a local folder go to vLLM as they are; so does an s3://
prefix when the job relies on the cluster's own credentials (Ray Data LLM fetches it on each
engine's node, which suits an autoscaling GPU group).

With S3 settings shipped with the job (pipeline/credentials.py: a custom endpoint, keys from an
Airflow connection), Ray Data LLM cannot use them (it reads each node's environment), so the model
is fetched here first, onto every node alive at the start, into ``cache_dir``; each node keeps one
copy per source URI, so a daily run fetches only once. Nodes that join later lack it: with an
autoscaling GPU group, give the cluster an IAM role instead.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import shutil
import uuid
from typing import Any

from airflow_provider_raybatch.pipeline import storage

log = logging.getLogger("airflow_provider_raybatch.pipeline")
_COMPLETE_MARKER = ".raybatch-complete"


def local_model_dir(model_uri: str, cache_dir: str) -> str:
    """Where a node keeps its copy of an s3:// model (the same path on every node)."""
    digest = hashlib.sha256(model_uri.rstrip("/").encode()).hexdigest()[:16]
    return posixpath.join(
        posixpath.expanduser(cache_dir), f"{posixpath.basename(model_uri.rstrip('/'))}-{digest}"
    )


def fetch_model(model_uri: str, target: str) -> int:
    """Copy every file under ``model_uri`` into ``target`` unless a complete copy is there; returns the
    number of files copied.

    The copy is made in a sibling folder and renamed into place, so a crash never leaves a half model.
    """
    if os.path.exists(posixpath.join(target, _COMPLETE_MARKER)):
        return 0
    files = storage.list_files(model_uri)
    if not files:
        raise FileNotFoundError(f"model={model_uri!r}: no files under that prefix.")
    filesystem, prefix = storage.filesystem(model_uri)
    partial = f"{target}.partial-{uuid.uuid4().hex[:8]}"
    # Every key is checked before anything is written: S3 keys are plain strings, so one named
    # "m/../../.bashrc" or "m//etc/x" would otherwise be written outside the model's folder.
    relative_paths = [_relative_model_path(model_uri, prefix, path) for path in files]
    try:
        for path, relative in zip(files, relative_paths, strict=True):
            local = _inside(partial, relative, model_uri)
            os.makedirs(posixpath.dirname(local), exist_ok=True)
            with filesystem.open_input_stream(path) as source, open(local, "wb") as sink:
                shutil.copyfileobj(source, sink, length=8 << 20)
        open(posixpath.join(partial, _COMPLETE_MARKER), "w").close()
        os.rename(partial, target)
    except OSError:
        if not os.path.exists(posixpath.join(target, _COMPLETE_MARKER)):
            raise
        # else another fetch finished first (the rename found its folder): keep its copy
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # nothing half-copied stays in the cache
    return len(files)


def _relative_model_path(model_uri: str, prefix: str, path: str) -> str:
    """A listed file's path below the model's prefix; raises ValueError naming the key unless it is a
    plain relative path: not empty, not absolute, no ``.``, ``..`` or empty step, no NUL byte."""
    base = prefix.rstrip("/") + "/"
    relative = path[len(base) :] if path.startswith(base) else ""
    steps = relative.split("/")
    if not relative or "\0" in relative or any(step in ("", ".", "..") for step in steps):
        raise ValueError(
            f"model={model_uri!r}: refusing to fetch the model: the object {path!r} under it is not a "
            "plain relative path (an empty, '.' or '..' step, an absolute path, or a NUL byte), so it "
            "could be written outside the model's folder. Remove or rename that object in the bucket."
        )
    return relative


def _inside(folder: str, relative: str, model_uri: str) -> str:
    """``folder``/``relative``, checked to resolve inside ``folder`` (links included) before any write."""
    local = posixpath.join(folder, relative)
    root = os.path.realpath(folder)
    if os.path.commonpath([root, os.path.realpath(local)]) != root:
        raise ValueError(f"model={model_uri!r}: the file {relative!r} would be written outside {folder!r}.")
    return local


def resolve_model_source(model: str, cache_dir: str) -> str:
    """The model source to hand vLLM (see the module docstring)."""
    from airflow_provider_raybatch.pipeline.credentials import shipped_s3_settings

    if not model.startswith("s3://") or shipped_s3_settings() is None:
        storage.check_model_source(model)
        return model
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    target = local_model_dir(model, cache_dir)
    fetch = ray.remote(num_cpus=0)(fetch_model)
    nodes = [node["NodeID"] for node in ray.nodes() if node.get("Alive")]
    copied: list[Any] = ray.get(  # Any: counts from each node.
        [
            fetch.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
                model, target
            )
            for node in nodes
        ]
    )
    log.info("Model %s is at %s on %d node(s); files fetched: %s.", model, target, len(nodes), copied)
    storage.check_model_source(target)
    return target
