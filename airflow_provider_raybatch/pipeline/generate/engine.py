"""The engine replica's runtime: its EngineCore from a preloaded forkserver, raw vLLM's batch sizes,
how often it is restarted, and the error its EngineCore dies of.

What the replica (:mod:`.engine_actor`) and a warm pool's stage (:mod:`.pooled_stage`) run on; how
Ray Data LLM's processor is made to run them is :mod:`.stage_swap`'s. Nothing here imports Ray or
vLLM at module import, nor any other module of the engine's.

* **EngineCore from a forkserver.** vLLM's async engine (what Ray Data LLM's stage runs) always puts
  its EngineCore in a child process, and inside a Ray actor vLLM forces ``spawn``: the child imports
  torch and vLLM again from scratch (~15 s on the GPU machine, after the actor's own ~15 s of the same
  imports; raw ``LLM()`` forks in < 1 s). The replica's UDF starts a multiprocessing forkserver
  that preloads those modules *while* the actor imports them itself, and hands vLLM that context, so
  the EngineCore is forked from an already-importing clean process (no Ray threads, no CUDA). The
  child gets the parent's environment as it is at ``Process.start()``, as with spawn.
  ``RAYBATCH_ENGINE_FORKSERVER=0`` in the cluster's environment turns it off (the replica still runs
  our UDF). Forked so, the EngineCore is the replica's grandchild, which Ray does not always reach: it
  ends itself once its replica is gone (:mod:`.engine_lifetime`).
* **One Triton cache folder for every run.** torch's Inductor points ``TRITON_CACHE_DIR`` at its own
  folder when it compiles and the variable is unset (``triton_heuristics.py``), so on a node's first
  run vLLM's warm-up kernels land there too; a later run loads the compiled graphs, compiles nothing,
  and looks in Triton's default folder instead: it builds those kernels again (13-19 s on an H100),
  and only the third run finds them. The replica sets the variable before its engine starts,
  optionally under a configurable folder (``compile_cache_dir``), beside vLLM's and Inductor's, once
  it checked that each is the Ray user's alone (:mod:`.engine_caches`).
* **The model's class inspected in a forkserver child.** Building its config, vLLM inspects the model's
  class (``ModelRegistry.inspect_model_cls``) in a fresh interpreter (``python -m
  vllm.model_executor.models.registry``, so that the parent never initializes CUDA), unless a node's
  earlier engine left the answer in ``VLLM_CACHE_ROOT/modelinfos``. That interpreter imports torch and
  vLLM from scratch while the replica waits: on a fresh GPU node the first job's replica idled ~17 s
  there. The forkserver has them loaded already, so the inspection runs in a child forked from it
  (:func:`patch_vllm_model_inspection`): no CUDA either, and only the model's own module is imported.
  vLLM's subprocess stays where the forkserver is off or the child fails.
* **Raw vLLM's batch sizes.** Ray Data LLM builds its engine config without a usage context, which
  gets vLLM's generic 2,048 tokens and 128 sequences per scheduler step instead of what ``LLM()``
  gets (``EngineArgs.get_batch_defaults``: 4,096 / 256 on a CPU, 16,384 / 1,024 on an H100): on the
  CPU engine a step admitted ~29 prompts of ~70 tokens while 170 waited. Where the author set
  neither, the replica asks vLLM for its ``LLM()`` defaults (:func:`with_llm_class_batch_defaults`).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import pickle
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from multiprocessing import context as mp_context
from pathlib import Path
from typing import Any

from airflow_provider_raybatch.shared import job_settings
from airflow_provider_raybatch.shared.json_types import Kwargs

log = logging.getLogger("airflow_provider_raybatch.pipeline")

FORKSERVER_ENV = "RAYBATCH_ENGINE_FORKSERVER"
#: How many times Ray restarts one engine replica that died before the job fails. Ray Data's own
#: default is forever: an engine that crashes on every start, or on a batch it is handed again after
#: each restart (vLLM's "Fatal engine error, exiting actor to trigger restart"), kept the job running
#: with no row done and nothing said (100,000 images on an H100: 10 min, engines crash-looping). A replica
#: lost to a node or the OOM killer now and then is still restarted.
ENGINE_MAX_RESTARTS = 3
ENGINE_MAX_RESTARTS_ENV = "RAYBATCH_ENGINE_MAX_RESTARTS"
ENGINE_MAX_RESTARTS_LIMIT = 1000
# What the EngineCore process imports before it runs (vllm.v1.engine.core pulls torch and the model
# executor); "ray": the child re-runs the Ray worker's main module, as a spawned child does.
_PRELOAD = ("ray", "vllm.v1.engine.core")


def with_llm_class_batch_defaults(engine_kwargs: Kwargs) -> Kwargs:
    """``engine_kwargs`` with vLLM's ``LLM()`` defaults where unset: the tokens and sequences per step,
    and no engine statistics.

    Why: a batch job should get what raw vLLM gets. ``AsyncEngineArgs`` (which Ray Data LLM builds
    the engine from) keeps per-step statistics on, which ``LLM()`` turns off; in the replica they
    cost ~7% of its CPU per row (py-spy, bench/engine_feed.sh), and the replica's one process is
    what feeds the engine. ``disable_log_stats=False`` brings the "Running: N reqs" lines back.

    In a replica only: it imports vLLM, and the defaults depend on the accelerator it runs on.
    """
    defaults: Kwargs = {"disable_log_stats": True}
    if "max_num_batched_tokens" not in engine_kwargs or "max_num_seqs" not in engine_kwargs:
        import vllm
        from vllm.usage.usage_lib import UsageContext

        world_size = int(engine_kwargs.get("tensor_parallel_size") or 1) * int(
            engine_kwargs.get("pipeline_parallel_size") or 1
        )
        tokens, sequences = vllm.AsyncEngineArgs.get_batch_defaults(world_size)
        defaults["max_num_batched_tokens"] = tokens.get(UsageContext.LLM_CLASS)
        defaults["max_num_seqs"] = sequences.get(UsageContext.LLM_CLASS)
    return {**{key: value for key, value in defaults.items() if value is not None}, **engine_kwargs}


def forkserver_enabled() -> bool:
    return os.environ.get(FORKSERVER_ENV, "1") not in ("0", "false", "False", "")


def engine_max_restarts() -> int:
    """:data:`ENGINE_MAX_RESTARTS`, or the job's ``RAYBATCH_ENGINE_MAX_RESTARTS`` (a whole number >= 0)."""
    return job_settings.whole_number(ENGINE_MAX_RESTARTS_ENV, ENGINE_MAX_RESTARTS, ENGINE_MAX_RESTARTS_LIMIT)


#: A line naming an error (``ValueError: ...``, ``ray.exceptions.RayTaskError: ...``) in a traceback.
ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*")
_ENGINE_CORE_ERROR_CHARS = 500  # one line of a task's error
#: The folder of the engine build under way in this process (:func:`engine_core_errors`), else None.
_build_error_folder: str | None = None
_error_files = itertools.count()


@contextlib.contextmanager
def engine_core_errors() -> Iterator[Callable[[], str | None]]:
    """For one engine build: the error an EngineCore it starts dies of, kept for the build to quote.

    vLLM's parent only says ``Engine core initialization failed. See root cause above``: the cause
    (``ValueError: No available memory for the cache blocks``, say) is in the child's log alone, which
    the task never shows (a refused setting failed the task with vLLM's wrapper only). The
    EngineCores write into a folder of this build's own (``mkdtemp``: private, a name nobody can guess,
    so no other user can plant a link for them to write through), gone when the build ends: an
    EngineCore that dies later, holding the deleted folder open (:func:`_open_error_folder`), writes
    nothing, whatever was made at its name since. Yields a function that returns the
    first error written, in one line, or None (none written, or vLLM spawned its EngineCore itself).
    """
    global _build_error_folder
    folder = tempfile.mkdtemp(prefix="raybatch-enginecore-")
    _build_error_folder = folder
    try:
        yield functools.partial(_first_error_in, Path(folder))
    finally:
        _build_error_folder = None
        shutil.rmtree(folder, ignore_errors=True)


def _first_error_in(folder: Path) -> str | None:
    for path in sorted(folder.glob("*.error")):
        with contextlib.suppress(OSError):
            if text := path.read_text(encoding="utf-8", errors="replace").strip():
                return text
    return None


def error_line(err: BaseException) -> str:
    """An exception in one line: for a traceback's text (a Ray worker's error), its last error line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    named = [line for line in lines if ERROR_LINE.match(line)]
    line = named[-1] if len(lines) > 1 and named else f"{type(err).__name__}: {' '.join(lines)}"
    return line[:_ENGINE_CORE_ERROR_CHARS]


def _run_with_environ(
    environ: dict[str, str], error_path: str | None, target: Any, *args: Any, **kwargs: Any
) -> Any:
    """In the forked EngineCore: the environment the parent had at start(), a watch that ends it
    with its replica (:mod:`.engine_lifetime`), then vLLM's target; an error it dies of while its
    parent builds is left at ``error_path`` for the parent (:func:`engine_core_errors`)."""
    from airflow_provider_raybatch.pipeline.generate import engine_lifetime

    engine_lifetime.keep_process_title()  # before the environment is rebuilt
    os.environ.clear()
    os.environ.update(environ)
    engine_lifetime.end_with_replica()
    error_folder = _open_error_folder(error_path)
    try:
        return target(*args, **kwargs)
    except Exception as err:  # vLLM logs it and raises again: the parent hears only that it died
        if error_folder is not None and error_path is not None:
            with contextlib.suppress(Exception):  # never instead of vLLM's own error
                _write_error(error_folder, os.path.basename(error_path), error_line(err))
        raise
    finally:
        if error_folder is not None:
            os.close(error_folder)


def _open_error_folder(error_path: str | None) -> int | None:
    """The build's error folder, held open by descriptor from the EngineCore's start.

    The folder is removed when the build ends, but a warm EngineCore lives for hours and may die any
    time: writing by its path then would write into whatever another local user made at that name
    since (a folder of their own, a link to any file the Ray user can write). Through the descriptor,
    a write after the build finds the folder deleted and writes nothing. An EngineCore that starts
    after the build ended may find such a folder at the name: one not ``mkdtemp``'s (ours, private) is
    not used."""
    if error_path is None:
        return None
    try:
        folder = os.open(os.path.dirname(error_path), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:  # the build already ended: nothing to report to
        return None
    facts = os.fstat(folder)
    if facts.st_uid != os.geteuid() or facts.st_mode & 0o077:
        os.close(folder)
        return None
    return folder


def _write_error(folder: int, name: str, text: str) -> None:
    """Write ``text`` as a new file ``name`` in the folder open as ``folder``: never through a link,
    never over a file that is there."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    descriptor = os.open(name, flags, 0o600, dir_fd=folder)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(text)


class _ForkServerProcess(mp_context.ForkServerProcess):
    """A forkserver child that starts with the environment its parent had at ``start()``."""

    _target: Callable[..., Any] | None  # BaseProcess's private attribute (set in its __init__); Any: vLLM's

    def start(self) -> None:
        folder = _build_error_folder  # one file per EngineCore (data parallel: several per build)
        error_path = None if folder is None else os.path.join(folder, f"{next(_error_files):06d}.error")
        self._target = functools.partial(_run_with_environ, dict(os.environ), error_path, self._target)
        super().start()


@functools.cache
def _forkserver_context() -> Any:  # Any: a multiprocessing context look-alike
    import multiprocessing
    from multiprocessing import forkserver

    base = multiprocessing.get_context("forkserver")
    base.set_forkserver_preload(list(_PRELOAD))
    forkserver.ensure_running()  # starts importing now, beside this process's own imports

    class Context:
        Process = _ForkServerProcess

        def __getattr__(self, name: str) -> Any:
            return getattr(base, name)

    return Context()


def start_forkserver() -> None:
    """Start the preloading forkserver now; best effort (vLLM's spawn stays if anything fails)."""
    try:
        _forkserver_context()
    except Exception:  # noqa: BLE001 - an optimisation: never fail the replica over it
        log.warning("No forkserver for the EngineCore; vLLM spawns it.", exc_info=True)


def patch_vllm_process_context() -> bool:
    """Make vLLM start its EngineCore process from the forkserver; False (spawn) where it cannot."""
    try:
        import vllm.v1.engine.utils as engine_utils

        original = engine_utils.get_mp_context
        ctx = _forkserver_context()
    except Exception:  # noqa: BLE001 - an other vLLM layout: keep its own start method
        log.warning("vLLM's EngineCore start method left as it is.", exc_info=True)
        return False
    if getattr(original, "__raybatch__", False):
        return True

    def get_mp_context() -> Any:
        original()  # vLLM's side effects (RAY_ADDRESS for a Ray executor, visible-device env vars)
        return ctx

    get_mp_context.__raybatch__ = True  # type: ignore[attr-defined]  # our mark on a function
    engine_utils.get_mp_context = get_mp_context
    return True


def _inspect_in_child(environ: dict[str, str], payload: bytes, result_path: str) -> None:
    """In a forkserver child: vLLM's inspection function (``payload``, cloudpickled), its result
    pickled to ``result_path``, as vLLM's ``registry._run`` does in its subprocess."""
    os.environ.clear()
    os.environ.update(environ)
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    result = pickle.loads(payload)()
    with open(result_path, "wb") as file:
        pickle.dump(result, file)


def patch_vllm_model_inspection() -> bool:
    """Have vLLM inspect a model's class in a child of the preloaded forkserver instead of a fresh
    interpreter (see the module doc); False (vLLM's subprocess) where it cannot."""
    try:
        from vllm.model_executor.models import registry

        original = registry._run_in_subprocess
        _forkserver_context()
    except Exception:  # noqa: BLE001 - another vLLM layout, or no forkserver: keep vLLM's subprocess
        log.warning("vLLM inspects the model's class in a subprocess of its own.", exc_info=True)
        return False
    if getattr(original, "__raybatch__", False):
        return True

    def run_in_subprocess(fn: Callable[[], object]) -> object:
        import multiprocessing

        from ray import cloudpickle  # vLLM's function is a lambda: by value, as its own subprocess gets it

        with tempfile.TemporaryDirectory(prefix="raybatch-modelinfo-") as folder:  # 0700, ours alone
            result_path = os.path.join(folder, "result.pkl")
            child = multiprocessing.get_context("forkserver").Process(
                target=_inspect_in_child, args=(dict(os.environ), cloudpickle.dumps(fn), result_path)
            )
            child.start()
            child.join()
            if child.exitcode == 0 and os.path.exists(result_path):
                with open(result_path, "rb") as file:
                    return pickle.load(file)
        log.warning("Inspecting the model's class in a forkserver child failed: vLLM's subprocess does it.")
        return original(fn)  # with vLLM's own error, if it fails there too

    run_in_subprocess.__raybatch__ = True  # type: ignore[attr-defined]  # our mark on a function
    registry._run_in_subprocess = run_in_subprocess
    return True
