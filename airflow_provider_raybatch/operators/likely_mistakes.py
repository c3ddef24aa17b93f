"""Values a batch task may legally take that are most likely not what its author meant: said as a
warning when the DAG is parsed (values written as they are) and by ``validate()`` (rendered ones).

They are warnings, not errors, because each can be right: the cluster's vLLM may take an engine
argument this side has never heard of, a Ray cluster may define a custom resource named ``gpu``, and
a preprocess read from its source may set a key on a path no row takes. Each message says what will
happen if the value stays.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from airflow_provider_raybatch.operators.arguments import ENGINE_ARGUMENTS
from airflow_provider_raybatch.shared.json_types import ArgValue
from airflow_provider_raybatch.shared.user_functions import keys_set_by

#: How alike an unknown engine_kwargs key must be to a common engine argument to be named as its
#: misspelling. No engine argument of vLLM 0.32 that is missing from ENGINE_ARGUMENTS comes this close
#: to one in it (max_cpu_loras to max_loras is 0.82), so a real argument is not taken for a typo.
_ENGINE_CUTOFF = 0.85
#: Ray's own resource names, which are case-sensitive: any other name is a custom resource, which
#: only nodes started with it (``ray start --resources``) have.
_RAY_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")
#: Ray runtime_env fields (Ray 2.57 - 2.60); a key outside them is taken as a plugin's.
_RUNTIME_ENV_FIELDS = frozenset(
    """
    py_modules py_executable java_jars working_dir conda pip uv container image_uri excludes env_vars
    worker_process_setup_hook config nsight rocprof_sys mpi
    """.split()
)
#: What a preprocess may return as the row's prompt, as in Ray Data LLM.
_PROMPT_KEYS = ("messages", "prompt")


def likely_mistakes(values: Mapping[str, ArgValue], dag_file: str | None = None) -> list[str]:
    """What to warn of in these parameter values (those known: written as is, or rendered).

    :param values: some of the operator's parameters by name; a parameter left out is not looked at.
    :param dag_file: the task's DAG file, if known: a preprocess module beside it is read too
        (:func:`.user_functions.keys_set_by`).
    """
    found = []
    engine_kwargs = values.get("engine_kwargs")
    if isinstance(engine_kwargs, dict):
        found += [_engine_argument(key) for key in engine_kwargs if _engine_argument(key)]
    for name in ("replica_resources", "entrypoint_resources"):
        resources = values.get(name)
        if isinstance(resources, dict):
            found += [_resource(name, key) for key in resources if _resource(name, key)]
    runtime_env = values.get("runtime_env")
    if isinstance(runtime_env, dict):
        found += [_runtime_env_field(key) for key in runtime_env if _runtime_env_field(key)]
    if (ignored := _ignored_prompt(values, dag_file)) is not None:
        found.append(ignored)
    return found


def _engine_argument(key: object) -> str:
    if not isinstance(key, str) or key in ENGINE_ARGUMENTS:
        return ""
    close = difflib.get_close_matches(key, sorted(ENGINE_ARGUMENTS), n=1, cutoff=_ENGINE_CUTOFF)
    if not close:
        return ""
    return (
        f"engine_kwargs[{key!r}] reads like vLLM's engine argument {close[0]!r}: did you mean "
        f"{close[0]!r}? If the Ray cluster's vLLM does not take {key!r}, the job fails at its start, "
        "before any engine starts."
    )


def _resource(name: str, key: object) -> str:
    if not isinstance(key, str) or key in _RAY_RESOURCES:
        return ""
    same_but_case = [resource for resource in _RAY_RESOURCES if resource.lower() == key.lower()]
    close = same_but_case or difflib.get_close_matches(key, _RAY_RESOURCES, n=1, cutoff=0.8)
    if not close:
        return ""
    return (
        f"{name}[{key!r}]: Ray's resource names are case-sensitive, and {key!r} is not one of them "
        f"(did you mean {close[0]!r}?); as a custom resource it needs nodes started with it "
        "(ray start --resources), or the job waits for one that never comes."
    )


def _runtime_env_field(key: object) -> str:
    if not isinstance(key, str) or key in _RUNTIME_ENV_FIELDS:
        return ""
    close = difflib.get_close_matches(key, sorted(_RUNTIME_ENV_FIELDS), n=1, cutoff=0.8)
    if not close:
        return ""
    return (
        f"runtime_env[{key!r}] is not a field of Ray's runtime_env (did you mean {close[0]!r}?); Ray "
        "takes an unknown field for a plugin's, and fails the job if the cluster has no such plugin."
    )


def _ignored_prompt(values: Mapping[str, ArgValue], dag_file: str | None) -> str | None:
    """A preprocess that returns the row's prompt beside user_template or messages_column, which
    the job uses instead: the preprocess's prompt is never seen by the model."""
    preprocess = values.get("preprocess")
    template, column = values.get("user_template"), values.get("messages_column")
    if not isinstance(preprocess, str) or (template is None and column is None):
        return None
    keys = keys_set_by(preprocess, dag_file) or frozenset()
    ignored = [key for key in _PROMPT_KEYS if key in keys and key != column]
    if not ignored:
        return None
    returned = " and ".join(repr(key) for key in ignored)
    if template is not None:
        system = values.get("system_prompt") is not None
        used = "user_template" + (" (with system_prompt)" if system else "")
        instead = f"leave user_template{' and system_prompt' if system else ''} unset"
        otherwise = "to use the template, have preprocess return the columns it reads instead"
    else:
        used = f"messages_column={column!r}"
        instead = "leave messages_column unset"
        otherwise = f"to keep messages_column, return the messages in {column!r}"
    return (
        f"preprocess={preprocess!r} returns {returned}, but each row's prompt is built from {used}: "
        f"the model never sees the {returned} preprocess returns. To prompt with it, {instead}; {otherwise}."
    )
