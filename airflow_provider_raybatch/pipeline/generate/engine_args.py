"""The engine arguments the cluster's vLLM takes, read from its source: a misspelled one fails the job.

Why: a key of ``engine_kwargs`` that vLLM does not know (``max_model_length`` for ``max_model_len``)
reached every engine replica, which died in its constructor (``AsyncEngineArgs.__init__() got an
unexpected keyword argument``) after importing vLLM; each was started again, up to
``RAYBATCH_ENGINE_MAX_RESTARTS`` times, and the reason was only in the replicas' own logs. On a loaded
2-core machine the job was still restarting replicas after 8 minutes.
The driver checks the keys before any replica starts, naming the key and the likeliest one meant.

The names come from ``vllm/engine/arg_utils.py``'s source, the fields of ``EngineArgs`` and
``AsyncEngineArgs``, not from importing vLLM: the driver never imports vLLM or torch (a warm job's
first row would wait the 10-20 s that costs). The Airflow side cannot check them at all: it has no
vLLM, and the cluster's may be another release. If the source cannot be read or its layout changes,
the check says nothing and the engine itself refuses, as before.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Mapping
from pathlib import Path

from airflow_provider_raybatch.shared.json_types import ArgValue
from airflow_provider_raybatch.shared.specs import did_you_mean

#: The classes whose fields are vLLM's engine arguments (Ray Data LLM builds ``AsyncEngineArgs``).
_ARG_CLASSES = ("EngineArgs", "AsyncEngineArgs")
#: Keys of ``engine_kwargs`` that Ray Data LLM's vLLM stage takes itself before it builds
#: ``AsyncEngineArgs`` (``vLLMEngineStageUDF.__init__``): not vLLM's, yet accepted.
TAKEN_BY_RAY_DATA_LLM = frozenset({"task_type", "model", "model_source"})


class UnknownEngineArgumentError(ValueError):
    """A key of ``engine_kwargs`` that the cluster's vLLM does not take: no engine could start."""


def installed_vllm_dir() -> Path | None:
    """The installed ``vllm`` package's folder, found without importing it; None without vLLM."""
    found = importlib.util.find_spec("vllm")
    if found is None or not found.submodule_search_locations:
        return None
    return Path(next(iter(found.submodule_search_locations)))


def engine_argument_names(vllm_dir: Path | None) -> frozenset[str] | None:
    """The fields of ``EngineArgs`` and ``AsyncEngineArgs`` in ``vllm_dir``'s source; None if unknown."""
    if vllm_dir is None:
        return None
    try:
        tree = ast.parse((vllm_dir / "engine" / "arg_utils.py").read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    names = {
        item.target.id
        for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name in _ARG_CLASSES
        for item in node.body
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
    }
    return frozenset(names) or None


def check_engine_kwargs(engine_kwargs: Mapping[str, ArgValue], known: frozenset[str] | None) -> None:
    """Refuse keys the engine does not take, naming each and the closest known one.

    :param known: :func:`engine_argument_names` (None: not known, nothing is checked).
    :raises UnknownEngineArgumentError: for any unknown key.
    """
    if not known:
        return
    unknown = sorted(key for key in engine_kwargs if key not in known and key not in TAKEN_BY_RAY_DATA_LLM)
    if not unknown:
        return
    described = [f"engine_kwargs[{key!r}]{did_you_mean(key, known)}" for key in unknown]
    raise UnknownEngineArgumentError(
        f"{', '.join(described)}: not an engine argument of the vLLM on the Ray cluster "
        "(vllm.AsyncEngineArgs would refuse it, so no engine replica could start). No engine was started "
        "and no row generated; fix the key and run the task again."
    )
