"""The Ray Data LLM internals the pipeline builds on, checked when a job starts.

Our engine stage subclasses Ray's ``vLLMEngineStageUDF`` and calls into its engine wrapper
(:mod:`.engine_actor`), our chat-template stage subclasses ``ChatTemplateUDF``
(:mod:`..prompt.chat_template`), the dry run tokenizes with ``TokenizeUDF``, the driver swaps the UDFs
of the stages Ray's processor names after their classes, through the stages' fields
(:mod:`.stage_swap`), and patches ``download_model_files`` while it builds (:mod:`.processor`), and a
staging's owner check reads Ray's job table (:mod:`..stage.ownership`). None of that is Ray's public
API, so a Ray release may rename or reshape it. Checked before a single row is read, such a change
fails the job at once, naming the Ray version and what changed, instead of in a replica minutes
later, or worse, by our engine stage being skipped without a word.

The same names are in Ray 2.57.0, 2.58.0 and 2.60.0 (compared from their released packages).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

_STAGES = "ray.llm._internal.batch.stages"
#: module -> {name in it: attributes the class must have}
REQUIRED: dict[str, dict[str, tuple[str, ...]]] = {
    f"{_STAGES}.vllm_engine_stage": {
        "vLLMEngineStage": (),
        "vLLMEngineStageUDF": ("__init__", "udf", "normalize_engine_kwargs", "IDX_IN_BATCH_COLUMN"),
        "vLLMEngineWrapper": ("_prepare_llm_request", "_generate_async", "generate_async"),
        "vLLMOutputData": ("from_vllm_engine_output",),
        "_convert_logprob_dict": (),
        "logger": ("name",),  # pool_replica.ROW_FAILURE_LOGGER: quietened in a shared replica
    },
    f"{_STAGES}.chat_template_stage": {"ChatTemplateStage": (), "ChatTemplateUDF": ("udf",)},
    f"{_STAGES}.tokenize_stage": {"TokenizeUDF": ()},
    f"{_STAGES}.base": {"StatefulStage": ("fn", "fn_constructor_kwargs", "map_batches_kwargs")},
    "ray.llm._internal.common.utils.download_utils": {"download_model_files": ()},
    # The job table whether a staging's owner still runs is read from (stage/ownership.py).
    "ray.dashboard.modules.job.common": {"JobInfoStorageClient": ("JOB_DATA_KEY",)},
    "ray._private.ray_constants": {"KV_NAMESPACE_JOB": ()},
    "ray.experimental.internal_kv": {"_internal_kv_get": ()},
    # What Ray prints in the driver for others starts no line of the job's log (pipeline/job_log.py).
    "ray._private.worker": {
        "process_tqdm": (),
        "print_to_stdstream": (),
    },
}


#: What a dry run uses (pipeline/dry_run.py): the prompt stages, not the engine's.
#: The Ray releases the test command runs the pipeline on (scripts/test_matrix.sh, README "Versions we test").
TESTED_RAY = "2.57.0 to 2.60.0"
DRY_RUN_MODULES = (f"{_STAGES}.chat_template_stage", f"{_STAGES}.tokenize_stage", f"{_STAGES}.base")


class RayInternalsChanged(RuntimeError):
    """This Ray release lacks or reshaped Ray Data LLM internals the pipeline builds on."""


def missing_internals(
    import_module: Callable[[str], ModuleType] = importlib.import_module, dry_run: bool = False
) -> list[str]:
    """The dotted names of :data:`REQUIRED` this Ray lacks (empty when all are there).

    :raises ImportError: a module of Ray's that is there could not import a library it needs (torch,
        say): not a change of Ray's, so not reported as one.
    """
    missing = []
    for module_name, names in REQUIRED.items():
        if dry_run and module_name not in DRY_RUN_MODULES:
            continue
        try:
            module = import_module(module_name)
        except ImportError as err:
            if err.name and not (err.name == module_name or module_name.startswith(f"{err.name}.")):
                raise  # a library Ray's module needs is missing on this node
            missing.append(f"{module_name} ({err})")
            continue
        for name, attributes in names.items():
            owner = getattr(module, name, None)
            if owner is None:
                missing.append(f"{module_name}.{name}")
                continue
            fields = getattr(owner, "model_fields", {})  # a pydantic model's fields are not attributes
            missing += [
                f"{module_name}.{name}.{attribute}"
                for attribute in attributes
                if not hasattr(owner, attribute) and attribute not in fields
            ]
    return missing


def check_ray_internals(
    ray_version: str, import_module: Callable[[str], ModuleType] | None = None, dry_run: bool = False
) -> None:
    """Raise :class:`RayInternalsChanged` naming ``ray_version`` and what is missing, if anything is.

    In the driver, call it while :func:`.processor.engine_libraries_held_back` holds vLLM back (the
    stage modules import torch and vLLM at the top). ``dry_run``: only what a dry run uses.
    """
    missing = missing_internals(import_module or importlib.import_module, dry_run=dry_run)
    if missing:
        raise RayInternalsChanged(
            f"Ray {ray_version}: the Ray Data LLM internals this provider builds on were renamed or "
            f"removed, so the job stops before reading any row. Missing: {', '.join(missing)}. Run the "
            f"cluster on a Ray release this provider is tested with ({TESTED_RAY}), or upgrade the provider."
        )
