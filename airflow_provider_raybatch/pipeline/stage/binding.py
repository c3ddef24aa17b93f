"""What a run's staged rows were made from: the spec, the input files, the code, the model.

A retry resumes the rows an earlier try staged, takes the rows it held, and reads back the rows it
prepared (:mod:`..read.prepared_cache`) only when all four are as they were; otherwise those rows are
another run's, and a retry that took them would commit a mix (an input rewritten in place between
two tries), or an old code's answers (a preprocess fixed under the same name). The spec's fingerprint
alone covers none of the other three: the input is named, not hashed; the author's modules travel by
name; the model is a path or an id.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import airflow_provider_raybatch
from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.specs import BatchInferenceSpec
from airflow_provider_raybatch.utils.user_functions import split_dotted_path

#: What each field is, as a log line names a change.
_WHAT = {
    "spec": "the job's parameters",
    "input": "the input files",
    "code": "the code (the provider's, or the module of preprocess or postprocess)",
    "model": "the model's files",
}


class InputChangedError(RuntimeError):
    """The input files changed while the job ran: its rows are of the input as it was."""


@dataclass(frozen=True)
class RunBinding:
    """Digests of what a run's rows were made from (:func:`binding_of`). Empty text: not known."""

    spec: str
    input: str = ""
    code: str = ""
    model: str = ""

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
        spec=spec.fingerprint(), input=input_digest, code=code_digest(spec), model=model_digest(spec.model)
    )


def code_digest(spec: BatchInferenceSpec) -> str:
    """The provider's version and the content of its package and of the author's modules
    (``preprocess``, ``postprocess``) as this process imports them: what the job shipped."""
    roots = [Path(airflow_provider_raybatch.__file__).parent]
    for dotted_path in filter(None, (spec.preprocess, spec.postprocess)):
        module = split_dotted_path(dotted_path)[0]
        importlib.import_module(module)
        top = sys.modules[module.split(".")[0]]
        roots.append(Path(top.__path__[0]) if hasattr(top, "__path__") else Path(top.__file__ or ""))
    digest = hashlib.sha256(airflow_provider_raybatch.__version__.encode())
    for root in dict.fromkeys(roots):  # in order, once each
        files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
        for path in files:
            digest.update(str(path.relative_to(root.parent)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:32]


def model_digest(model: str) -> str:
    """The model's files as listed now (each one's path, size and modification time), for a model in
    a folder or on S3; a hub id as it is (its files are the hub's to version)."""
    if "://" not in model and not Path(model).is_dir():
        return model
    try:
        infos = storage.input_file_infos(model, None)
    except OSError:  # gone since the job resolved it: the build says so
        return model
    listing = sorted((info.path, info.size, info.mtime_ns) for info in infos)
    return hashlib.sha256(json.dumps([model, listing]).encode()).hexdigest()[:32]
