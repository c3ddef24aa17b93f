"""The ray.data.llm processor, built in the job's driver without importing vLLM, torch or transformers.

Why: building the processor is all the driver does with Ray Data LLM, yet ``build_processor`` made it
import vLLM, torch and transformers (CPU: ~19 s of a ~19 s build; one H100: 24-27 s, bench/RESULTS.md
section 6), between the last read pass and the moment the engine replicas can start. The replicas import
them again themselves.

Where those imports come from (Ray 2.57 and 2.60 alike; 2.57 also at ``vLLMEngineProcessorConfig``'s
import, 2.60 only in the build):

* Ray's stage modules: ``stages/vllm_engine_stage.py`` does ``import torch`` and imports
  ``ray.llm._internal.common.errors``, which imports ``vllm.v1.engine.exceptions`` (all of vLLM, ~14 s
  on the CPU); ``common/utils/download_utils.py`` does ``try_import("torch")``; 2.57's
  ``processor/vllm_engine_proc.py`` does ``import transformers``. None of them *uses* the library
  at import: only the stages' UDFs do, and those run in the replicas, which unpickle the UDF classes
  by module and name and import everything for real.
* The build's usage-telemetry block: ``download_model_files`` (``torch.hub`` for a cache folder, and
  a download for a remote model) and ``transformers.AutoConfig.from_pretrained`` (imports torch), only
  to report the model's architecture to Ray's usage stats.

So, while :func:`build_llm_processor` builds, and only in this process:

* ``import vllm`` fails. Ray's ``errors`` module is written for vLLM being absent; the driver's copy
  then lists no fatal engine errors, which only the engine UDF (in the replicas) reads.
* ``torch`` and ``transformers`` are stand-in modules that import the real library on first attribute
  access, so a module that bound them keeps working later; only an actual use pays the import.
* The telemetry probe reads ``architectures`` from the model folder's ``config.json`` (a Hub id or a
  remote path: reported as unknown) instead of downloading files and loading transformers.
* The telemetry report is sent to Ray's telemetry actor without waiting for that actor to start
  (:func:`_telemetry_report_not_awaited`).

Everything is put back when the build returns. The stages are Ray's own, built by Ray's own
``build_processor``, with our UDFs swapped in (:mod:`.stage_swap`): the processor is Ray's own, or,
where the warm pool leaves stages out, made from the rest by Ray's public ``Processor`` constructor;
the replicas run exactly as before. If a Ray upgrade
makes the build *use* torch or transformers, the stand-ins load them (slow, still correct), and
``tests/unit/pipeline/test_processor.py`` (which checks the driver's imports) fails.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import json
import os
import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.pipeline.generate.stage_swap import StageSwap, use_our_stages
from airflow_provider_raybatch.shared.json_types import ArgValue, CellValue, Kwargs

if TYPE_CHECKING:
    from ray.data.llm import Processor

#: Not imported while the processor is built: blocked (vLLM) or deferred to their first use.
BLOCKED = ("vllm",)
DEFERRED = ("torch", "transformers")
_DOWNLOAD_UTILS = "ray.llm._internal.common.utils.download_utils"
_TELEMETRY = "ray.llm._internal.batch.observability.usage_telemetry.usage"

_building = threading.local()


def _in_build() -> bool:
    return getattr(_building, "active", False)


def build_llm_processor(
    config_kwargs: Kwargs,
    preprocess: Callable[[Kwargs], Kwargs],
    postprocess: Callable[[Kwargs], Kwargs],
    swap: StageSwap,
) -> Processor:
    """``build_processor(vLLMEngineProcessorConfig(**config_kwargs), ...)`` with our stages.

    :param config_kwargs: ``vLLMEngineProcessorConfig`` keywords (built in ``run._processor``).
    :param preprocess: row -> the engine request (``messages``/``prompt``, ``sampling_params``, ...).
    :param postprocess: the engine's row -> the pipeline's row.
    :param swap: what our stages need: where the replicas stage the rows they finish, their compile
        cache, a model copy the driver fetched, a warm pool (:class:`.stage_swap.StageSwap`).
    """
    with engine_libraries_held_back():
        _answer_the_telemetry_probe_locally()
        _telemetry_report_not_awaited()
        from ray.data.llm import Processor, build_processor, vLLMEngineProcessorConfig

        config = vLLMEngineProcessorConfig(**config_kwargs)
        built = build_processor(config, preprocess=preprocess, postprocess=postprocess)
        # Imports our stages' modules, which import Ray's (already loaded by the build, with the stand-ins).
        return use_our_stages(
            built,
            swap,
            lambda stages: Processor(config, stages, preprocess=preprocess, postprocess=postprocess),
        )


@contextlib.contextmanager
def engine_libraries_held_back() -> Iterator[None]:
    """Block vLLM and defer torch and transformers in ``sys.modules`` for the block (see the module doc).

    A library this process has already imported is left as it is (nothing to save).
    """
    before = {name: sys.modules.get(name, _ABSENT) for name in (*BLOCKED, *DEFERRED)}
    for name in BLOCKED:
        if before[name] is _ABSENT:
            sys.modules[name] = None  # type: ignore[assignment] # then `import vllm` raises ImportError
    for name in DEFERRED:
        if before[name] is _ABSENT and importlib.util.find_spec(name) is not None:
            sys.modules[name] = _DeferredModule(name)
    _building.active = True
    try:
        yield
    finally:
        _building.active = False
        for name in (*BLOCKED, *DEFERRED):
            current = sys.modules.get(name, _ABSENT)
            if before[name] is _ABSENT and (current is None or isinstance(current, _DeferredModule)):
                del sys.modules[name]  # a later import gets the real library


_ABSENT = object()


class _DeferredModule(types.ModuleType):
    """Stands in for a library in ``sys.modules``: the first attribute asked for imports the real one.

    While the processor is built, transformers' ``AutoConfig`` is the telemetry probe instead.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__spec__ = importlib.util.find_spec(name)  # so importlib.util.find_spec(name) keeps working

    def __getattr__(self, attribute: str) -> CellValue:
        if attribute == "AutoConfig" and self.__name__ == "transformers" and _in_build():
            return _ArchitectureProbe
        if attribute.startswith("__") and attribute not in ("__path__", "__version__", "__all__"):
            raise AttributeError(attribute)  # hasattr(module, "__file__") and the like: not a use
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), attribute)


class _ArchitectureProbe:
    """What Ray's telemetry asks of ``transformers.AutoConfig``: the model's architectures, if local."""

    @staticmethod
    def from_pretrained(model_path: str, **_: ArgValue) -> types.SimpleNamespace:
        architectures: list[str] = []
        config_file = os.path.join(str(model_path), "config.json")
        if os.path.isfile(config_file):
            with open(config_file, encoding="utf-8") as handle:
                architectures = list(json.load(handle).get("architectures") or [])
        return types.SimpleNamespace(architectures=architectures)


def _answer_the_telemetry_probe_locally() -> None:
    """Wrap Ray's ``download_model_files`` once, before the build imports it (Ray 2.57 binds it then)."""
    download_utils: Any = importlib.import_module(_DOWNLOAD_UTILS)  # with the stand-in torch; Any: Ray's.
    if not getattr(download_utils.download_model_files, "__raybatch__", False):
        download_utils.download_model_files = _skipped_while_building(download_utils.download_model_files)


def _telemetry_report_not_awaited() -> None:
    """Wrap Ray's ``TelemetryAgent.push_telemetry_report`` once: while we build, the report is sent and
    not waited for.

    Ray waits for its telemetry actor to record the report (``ray.get``), and on a cluster's first job
    that actor is made then: a worker process started and Ray imported, 5-8 s on the 2-core VM. A
    warm pool's replicas are asked for only once the processor is built (``run._engine_ready``), so
    a cold replica started that much later than the reads it is meant to build beside (8 s into a
    10.5 s read). Best effort: another Ray layout keeps Ray's own.
    """
    try:
        agent: Any = importlib.import_module(_TELEMETRY).TelemetryAgent  # Any: Ray's class
        push = agent.push_telemetry_report
    except (ImportError, AttributeError):
        return
    if getattr(push, "__raybatch__", False):
        return

    @functools.wraps(push)
    def push_telemetry_report(self: Any, telemetry: Any) -> None:  # Any: Ray's agent and report
        remote = getattr(self, "remote_telemetry_agent", None)
        if not _in_build() or remote is None:
            return push(self, telemetry)
        with contextlib.suppress(Exception):  # as Ray's: telemetry never breaks the build
            remote.record.remote(telemetry)  # sent; the actor records it once it is up
        return None

    push_telemetry_report.__raybatch__ = True  # type: ignore[attr-defined]  # our mark on a function
    agent.push_telemetry_report = push_telemetry_report


def _skipped_while_building(download: Callable[..., Any]) -> Callable[..., Any]:
    """Ray's ``download_model_files``, except that the build's telemetry probe gets the model id back."""

    @functools.wraps(download)
    def download_model_files(*args: Any, **kwargs: Any) -> Any:  # Any: download_model_files' own.
        if _in_build():
            return kwargs.get("model_id", args[0] if args else None)
        return download(*args, **kwargs)

    download_model_files.__raybatch__ = True  # type: ignore[attr-defined]  # our mark on a function
    return download_model_files
