"""One replica of a warm engine pool: a detached Ray actor that keeps a vLLM engine between jobs.

It builds its engine exactly as a job's own replica does (our :class:`.RaybatchvLLMEngineStageUDF`,
Ray Data LLM's UDF underneath, with the forkserver, the compile cache and the batch defaults) and
answers one row at a time with Ray Data LLM's own per-row code (``_generate_with_error_handling``):
a row that fails inference comes back as an error row, a fatal engine error ends the actor (Ray's
``os._exit``), and the job's stage replaces it (:mod:`.pooled_stage`). It stages nothing: the rows go
back to the job's stage, which stages them as a job's own replica does, so exactly-once output,
resume and the commit protocol do not know a pool exists.

Its lifetime is the keep-warm window, nothing else (:mod:`.engine_pool` says why):

* A job holds a **lease** while it runs (``attach``, renewed by its driver every few seconds,
  ``release`` at its end). A lease not renewed for :data:`LEASE_SECONDS` is a job that was stopped or
  killed: its requests still in the engine are cancelled (vLLM aborts a cancelled request), so a
  killed task never keeps generating rows nobody will stage, and other jobs' rows go on.
* With no lease and nothing in flight for ``keep_warm_seconds`` (the last job's setting), the
  replica shuts its engine down and exits: the GPUs are free again (scale to zero).
* ``retire_if_idle`` lets a job that needs the resources end an idle replica of another pool at once
  (a cluster without spare GPUs never waits on an idle pool).
* Work that knows nothing of pools (another team's job, a Ray Data pipeline) cannot ask: an idle
  replica looks at what Ray waits to place and gives way to work its end would make room for
  (:data:`GIVE_WAY_AFTER_IDLE_SECONDS`, :mod:`.cluster_demand`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_provider_raybatch.pipeline.generate import cluster_demand, engine_caches
from airflow_provider_raybatch.pipeline.generate.models import MODEL_COPY_KWARG
from airflow_provider_raybatch.pipeline.openai.openai_batch import EXTRA_INPUTS
from airflow_provider_raybatch.pipeline.private_folders import PrivateFolderError
from airflow_provider_raybatch.pipeline.row_marks import INFERENCE_ERROR, ROW_REASON_MARK
from airflow_provider_raybatch.shared.json_types import JsonObject, Kwargs, Row
from airflow_provider_raybatch.shared.specs import KEEP_WARM_SECONDS_LIMIT

if TYPE_CHECKING:
    from airflow_provider_raybatch.pipeline.prompt.chat_template import RaybatchChatTemplateUDF

log = logging.getLogger("airflow_provider_raybatch.pipeline")
_T = TypeVar("_T")

#: The replica's concurrency group of its control calls (attach, release, health, make-room): their own
#: slots, apart from the rows' (``max_concurrency``), so that a job with thousands of rows in flight never
#: holds another job's attach, or its driver's lease renewals and health checks, behind its rows.
CONTROL_GROUP = "control"
#: Control calls a replica runs at once.
CONTROL_CALLS = 64
_Method = TypeVar("_Method", bound=Callable[..., Any])


def _control_call(method: _Method) -> _Method:
    """Put ``method`` in the replica's :data:`CONTROL_GROUP` (where Ray is: the replica's logic is also
    tested without it)."""
    try:
        import ray
    except ImportError:
        return method
    marked: _Method = ray.method(concurrency_group=CONTROL_GROUP)(method)
    return marked


#: A job's lease lasts this long unless its driver renews it (every :data:`LEASE_RENEW_SECONDS`).
LEASE_SECONDS = 30.0
LEASE_RENEW_SECONDS = 5.0
#: How often the replica looks at its leases and its keep-warm window.
_TICK_SECONDS = 1.0
#: An idle replica gives way to other work that waits for what it holds (:meth:`EngineReplica._give_way`)
#: once idle this long: a backfill's next date, a few seconds behind the last, still finds it warm.
GIVE_WAY_AFTER_IDLE_SECONDS = 30.0
#: How often an idle replica looks at what Ray waits to place, and how many looks in a row must see
#: such work: a task that Ray places a moment later is not waiting for this replica.
_GIVE_WAY_LOOK_SECONDS = 5.0
_GIVE_WAY_LOOKS = 2
#: One job's sequences in a replica's engine at once, at most, in running batches of the engine (vLLM's
#: ``max_num_seqs``), whatever ``batch_size x max_concurrent_batches`` it asks for. Counted in sequences,
#: not rows: a row asking for ``n`` choices is ``n`` sequences in vLLM's batch, an embeddings line one per
#: input (:func:`_sequences`). The engine always has the job's next rows waiting (Ray Data LLM's wrapper
#: lets ~1.1 batches in and queues the rest first come, first served), and a second job's rows wait
#: behind about one batch of the first's, not behind its whole backlog; then the two take turns in that
#: queue, about half each.
JOB_SHARE_IN_RUNNING_BATCHES = 2
#: Chat templates no job renders with that a replica keeps loaded (a tokenizer each) for the next job.
_SPARE_CHAT_TEMPLATES = 2
#: vLLM's ``max_num_seqs`` where neither the engine nor its settings say.
_DEFAULT_MAX_NUM_SEQS = 256
#: Ray Data LLM's logger of a row whose inference failed (its index and vLLM's error). A replica serves
#: many jobs, and Ray sends an actor's log lines to the driver log of the job that created it: one
#: DAG's task log would show another's rows' failures. The row's error output carries the reason to
#: its own job instead; the engine's fatal errors (ERROR) are still logged.
ROW_FAILURE_LOGGER = "ray.llm._internal.batch.stages.vllm_engine_stage"


class EngineReplica:
    """A vLLM engine kept warm for the jobs whose engine settings have this pool's fingerprint.

    :param engine_kwargs: the constructor keywords of Ray Data LLM's vLLM stage UDF, as the job's
        processor built them (model, engine_kwargs, task_type, ...).
    :param compile_cache_dir: the spec's ``compile_cache_dir``.
    :param fingerprint: the pool's (:func:`.engine_pool.pool_fingerprint`), for its reports.
    :param keep_warm_seconds: the creating job's: how long the replica waits for a first job once built
        (that job's driver may have died while the engine built: nobody would ever attach).
    :param model_copy_root: the ``model_cache_dir`` of a model copy the creating job's driver fetched,
        checked on this node before the engine loads it (:func:`.models.check_copy_in_replica`).
    """

    #: The loop the rows and the engine run on (:meth:`_on_rows_loop`); None outside a Ray actor.
    _loop: asyncio.AbstractEventLoop | None = None
    #: The folders its engine loads compiled code from (:mod:`.engine_caches`), checked again at each attach.
    _cache_folders: tuple[engine_caches.CacheFolder, ...] = ()
    #: When it last looked for other work waiting for what it holds, and how many looks in a row saw some.
    _looked_for_waiting_work_at = 0.0
    _looks_that_saw_waiting_work = 0

    def __init__(
        self,
        engine_kwargs: dict[str, Any],
        compile_cache_dir: str | None,
        fingerprint: str,
        keep_warm_seconds: float = 0.0,
        chat_template: dict[str, Any] | None = None,
        model_copy_root: str | None = None,
    ) -> None:
        # Before the imports (vLLM's among them): the build time is all the replica's own start-up.
        started = time.monotonic()
        logging.getLogger(ROW_FAILURE_LOGGER).setLevel(logging.ERROR)
        self._engine_started_at = time.time()  # wall clock: replicas of one pool compare their start-ups
        from airflow_provider_raybatch.pipeline.generate.engine_actor import RaybatchvLLMEngineStageUDF

        self._engine = RaybatchvLLMEngineStageUDF(
            data_column="__data",
            expected_input_keys=[],
            raybatch_staging=None,
            raybatch_compile_cache_dir=compile_cache_dir,
            raybatch_model_copy_root=model_copy_root,
            **engine_kwargs,
        )
        self._cache_folders = self._engine.cache_folders
        # The chat template is the job's, not the engine's: jobs of one model and engine settings share
        # the replica whatever their chat-template settings (a completions job has none), each rendering
        # with its own. The creating job's is loaded with the engine; another job's at its first attach.
        self._chat_templates: dict[str, RaybatchChatTemplateUDF] = {}  # by chat_template_key
        self._job_templates: dict[str, str] = {}  # job id -> the chat_template_key its rows render with
        self._own_model = _ModelOfEngine(
            source=engine_kwargs.get("model"),
            trust_remote_code=bool(
                (engine_kwargs.get("engine_kwargs") or {}).get("trust_remote_code", False)
            ),
            copy_root=model_copy_root,
        )
        if chat_template is not None:
            self._chat_templates[chat_template_key(chat_template)] = _chat_template_udf(chat_template)
        self._fingerprint = fingerprint
        self._engine_build_seconds = round(time.monotonic() - started, 3)
        self._engine_ready_at = time.time()
        self._keep_warm_seconds = _bounded_keep_warm(keep_warm_seconds)
        self._leases: dict[str, float] = {}  # job id -> when its lease ends (monotonic)
        self._in_flight: dict[str, set[asyncio.Task[Any]]] = {}  # job id -> its requests in the engine
        self._rows_by_source: dict[
            tuple[str, str], asyncio.Task[Any]
        ] = {}  # (job id, row source) -> its call
        self._last_active = time.monotonic()
        self._jobs_served: list[str] = []
        self._rows_done = 0
        self._rows_by_job: dict[str, int] = {}  # job id -> rows answered for it, until it releases
        self._job_share = JOB_SHARE_IN_RUNNING_BATCHES * _max_num_seqs(self._engine, engine_kwargs)
        self._shares: dict[str, _JobShare] = {}  # job id -> its rows' places in the engine
        self._watch: asyncio.Task[None] | None = None
        self._retiring = False
        # The loop the rows and the engine run on. Ray runs an async actor's __init__ on it: the watch
        # starts with the replica, so one whose creator died while it built (nobody ever attaches) ends.
        with contextlib.suppress(RuntimeError):  # no loop (built outside Ray): the first attach starts it
            self._loop = asyncio.get_running_loop()
            self._watch = self._loop.create_task(self._watch_leases())

    # The job side ------------------------------------------------------------------------------

    async def _on_rows_loop(self, call: Coroutine[Any, Any, _T]) -> _T:
        """Run ``call`` on the loop the rows and the engine run on. A control call runs on its own
        group's loop (another thread): the replica's state and vLLM's engine belong to the rows' loop."""
        loop = self._loop
        if loop is None or loop is asyncio.get_running_loop():
            return await call
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call, loop))

    @_control_call
    async def attach(
        self, job_id: str, keep_warm_seconds: float, chat_template: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Hold (or renew) ``job_id``'s lease; the replica's state before this call.

        :param chat_template: the keywords of the job's chat-template stage, where the replica renders
            its rows' prompts (the job's stage sends them; a lease renewal does not).
        """
        return await self._on_rows_loop(self._attach(job_id, keep_warm_seconds, chat_template))

    async def _attach(
        self, job_id: str, keep_warm_seconds: float, chat_template: JsonObject | None
    ) -> JsonObject:
        keep_warm = _bounded_keep_warm(keep_warm_seconds)
        await self._refuse_if_retiring()
        self._check_cache_folders()
        state = self._state()
        if chat_template is not None:
            await self._hold_chat_template(job_id, chat_template)
        if job_id not in self._jobs_served:
            self._jobs_served.append(job_id)
        self._leases[job_id] = time.monotonic() + LEASE_SECONDS
        self._keep_warm_seconds = keep_warm
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_leases())
        return state

    def _check_cache_folders(self) -> None:
        """Check the engine's cache folders again, as before it was built; a refused one ends the replica.

        A replica lives for hours, and its engine loads from these folders whenever it compiles a shape
        it has not seen: a folder that a tmp cleaner deleted under it and another local user made
        again would serve that user's code. Each attach (a job's first, and its driver's renewals every
        few seconds) looks again. A refused folder ends the replica rather than having a fresh one
        built: a fresh one would check the same folder and be refused too, so the engine build would be
        for nothing, while the job learns why at once (the attach raises). The end is abrupt, not
        the engine's orderly shutdown: rows still in the engine must reach their jobs as a dead
        replica (sent again elsewhere), not as rows failed by an engine shutting down.

        :raises PrivateFolderError: naming the cache, the folder and what is wrong with it.
        """
        try:
            engine_caches.check(self._cache_folders)
        except PrivateFolderError as err:
            self._retire(f"a cache folder of its engine was refused at a later look: {err}", orderly=False)
            raise

    @_control_call
    async def release(self, job_id: str) -> dict[str, int]:
        """``job_id`` is done or stopped: its lease ends now and its requests still in the engine are
        cancelled (a finished job has none); the keep-warm window starts once nothing is in flight.
        Returns how many of the job's rows this replica answered (the manifest's per-replica share)."""
        return await self._on_rows_loop(self._release(job_id))

    async def _release(self, job_id: str) -> dict[str, int]:
        self._leases.pop(job_id, None)
        self._job_templates.pop(job_id, None)
        self._cancel(job_id, "released its lease")
        self._last_active = time.monotonic()
        return {"rows": self._rows_by_job.pop(job_id, 0)}

    async def generate(self, row: Row, job_id: str, render: bool = True) -> Row:
        """Ray Data LLM's per-row call on this engine: the row's engine output (an error row on failure).

        :param render: apply the chat template to the row's messages; False where the job's own stages
            rendered them (a batch with images), which then still carries its messages.
        """
        await self._refuse_if_retiring()
        source = row.get("source")
        key = (job_id, source) if isinstance(source, str) else None
        if key is not None and (first := self._rows_by_source.get(key)) is not None:
            # The row sent again while its first call runs here (that call's answer was lost on the
            # way: the replica was unreachable for a moment): it takes that call's answer, rather than
            # run, and be held, twice. A cancel from the job's side cannot reach the first call: to
            # its caller it had ended.
            answer: Row = await asyncio.shield(first)
            return answer
        task = asyncio.current_task()
        assert task is not None  # an async actor method runs in a task
        self._in_flight.setdefault(job_id, set()).add(task)
        if key is not None:
            self._rows_by_source[key] = task
        try:
            failed = self._render(row, job_id) if render else None
            if failed is not None:
                return failed
            async with self._shares.setdefault(job_id, _JobShare(self._job_share)).held(_sequences(row)):
                output = await self._engine._generate_with_error_handling(row, _BATCH)
        finally:
            self._in_flight[job_id].discard(task)
            if key is not None:
                self._rows_by_source.pop(key, None)
            if not self._in_flight[job_id]:  # none of its rows waits for a place either
                del self._in_flight[job_id]
                self._shares.pop(job_id, None)
            self._last_active = time.monotonic()
        self._rows_done += 1
        self._rows_by_job[job_id] = self._rows_by_job.get(job_id, 0) + 1
        return _portable(output)

    async def _hold_chat_template(self, job_id: str, settings: dict[str, Any]) -> None:
        """Render ``job_id``'s rows with the chat template ``settings`` describe, loaded once per
        settings (its tokenizer loads in a thread: the other jobs' rows go on meanwhile)."""
        key = chat_template_key(settings)
        if key not in self._chat_templates:
            self._own_model.check_chat_template(settings)
            udf = await asyncio.to_thread(_chat_template_udf, settings)
            self._chat_templates.setdefault(key, udf)
        self._job_templates[job_id] = key
        in_use = set(self._job_templates.values())
        for unused in [held for held in self._chat_templates if held not in in_use][:-_SPARE_CHAT_TEMPLATES]:
            del self._chat_templates[unused]  # oldest first: a dict keeps the order they were loaded in

    def _render(self, row: Row, job_id: str) -> Row | None:
        """Apply the job's chat template to the row's messages, as the job's chat-template stage would
        have; the row's error output if its conversation cannot be rendered (a row's fault, not the
        job's)."""
        template = self._chat_templates.get(self._job_templates.get(job_id, ""))
        if template is None or row.get("messages") is None:
            return None  # rendered already, or the row's own prompt (a preprocess that returned 'prompt')
        from airflow_provider_raybatch.pipeline.prompt.chat_template import (
            CHAT_TEMPLATE_FAILED,
            conversation_of,
        )

        try:
            row["prompt"] = template._render(conversation_of(row.pop("messages")))
        except Exception as err:  # noqa: BLE001 - this row's conversation, not the job's
            reason = f"{ROW_REASON_MARK}{CHAT_TEMPLATE_FAILED}: {type(err).__name__}: {err}"
            index = self._engine.IDX_IN_BATCH_COLUMN
            return {index: row[index], "prompt": "", "num_input_tokens": 0, INFERENCE_ERROR: reason}
        return None

    @_control_call
    async def health(self) -> dict[str, Any]:
        """The replica's state, after asking vLLM whether its engine is alive (raises if it is not)."""
        return await self._on_rows_loop(self._health())

    async def _health(self) -> JsonObject:
        await self._refuse_if_retiring()
        await self._engine.llm.engine.check_health()
        return self._state()

    @_control_call
    async def retire_if_idle(self, lacking: dict[str, list[str]] | None = None) -> bool:
        """End the replica now if no job holds it and nothing is in flight; True if it ends.

        A replica built moments ago that no job has attached to yet is not idle: its creator's attach
        is on its way (a make-room call queued while it built may run first).

        :param lacking: node id -> the resources the asking job's replica lacks there, for the nodes
            that could host it (:data:`.cluster_demand.ANY_NODE`: any). A replica on another node, or
            holding none of one of them, stays: its end would not let that replica be placed. None: it
            ends if idle.
        """
        return await self._on_rows_loop(self._retire_if_idle(lacking))

    async def _retire_if_idle(self, lacking: dict[str, list[str]] | None) -> bool:
        if self._retiring:
            return True
        fresh = not self._jobs_served and time.monotonic() - self._last_active < LEASE_SECONDS
        if self._leases or self._in_flight or fresh:
            return False
        if lacking is not None and not cluster_demand.would_make_room(lacking, *self._place()):
            return False
        self._retire("another job needs its resources")
        return True

    # The replica's own lifetime ------------------------------------------------------------------

    def _place(self) -> tuple[str, dict[str, float]]:
        """This replica's node id, and the resources Ray reserved for it."""
        import ray

        context = ray.get_runtime_context()
        return context.get_node_id(), dict(context.get_assigned_resources())

    async def _refuse_if_retiring(self) -> None:
        """A retiring replica takes no new work: the call waits for the actor's end (a moment away),
        so its caller sees the replica dead and replaces it, instead of a row failed by an engine
        that is shutting down."""
        while self._retiring:
            await asyncio.sleep(_TICK_SECONDS)

    def _state(self) -> JsonObject:
        return {
            "fingerprint": self._fingerprint,
            "jobs_served": len(self._jobs_served),
            "rows_done": self._rows_done,
            "leases": len(self._leases),
            "in_flight": sum(len(tasks) for tasks in self._in_flight.values()),
            "idle_seconds": round(time.monotonic() - self._last_active, 3),
            "engine_build_seconds": self._engine_build_seconds,
            "engine_started_at": self._engine_started_at,
            "engine_ready_at": self._engine_ready_at,
        }

    async def _watch_leases(self) -> None:
        while not self._retiring:
            await asyncio.sleep(_TICK_SECONDS)
            now = time.monotonic()
            for job_id, ends in list(self._leases.items()):
                if ends < now:  # its driver stopped renewing: stopped or killed
                    del self._leases[job_id]
                    self._rows_by_job.pop(job_id, None)
                    self._job_templates.pop(job_id, None)
                    self._cancel(job_id, "stopped renewing its lease")
            idle = not self._leases and not self._in_flight
            if not self._jobs_served:  # nobody attached yet: its creator's attach may still come
                if idle and now - self._last_active >= max(self._keep_warm_seconds, LEASE_SECONDS):
                    self._retire(
                        f"no job attached within {now - self._last_active:.0f} s of its engine being ready"
                    )
            elif idle and now - self._last_active >= self._keep_warm_seconds:
                self._retire(f"idle for {self._keep_warm_seconds:g} s (keep_warm_seconds)")
            if idle and now - self._last_active >= GIVE_WAY_AFTER_IDLE_SECONDS:
                await self._give_way(now)
            else:
                self._looks_that_saw_waiting_work = 0

    async def _give_way(self, now: float) -> None:
        """End the replica if Ray has waited, look after look, to place work that its end would make
        room for: another team's job, a Ray Data pipeline, anything that knows nothing of pools and
        would otherwise wait ``keep_warm_seconds`` for this replica's GPUs (a job of ours on other
        engines asks idle replicas itself, :func:`.engine_pool.make_room`)."""
        if self._retiring or now - self._looked_for_waiting_work_at < _GIVE_WAY_LOOK_SECONDS:
            return
        self._looked_for_waiting_work_at = now
        waiting = await asyncio.to_thread(self._work_waiting_for_this_replica)
        self._looks_that_saw_waiting_work = self._looks_that_saw_waiting_work + 1 if waiting else 0
        if waiting and self._looks_that_saw_waiting_work >= _GIVE_WAY_LOOKS:
            self._retire(f"idle, and other work waits for what it holds ({waiting})")

    def _work_waiting_for_this_replica(self) -> dict[str, float] | None:
        """A bundle Ray waits to place that this replica's end would make room for (None: none, or
        Ray cannot say; a replica outside Ray looks at nothing)."""
        import ray

        if not ray.is_initialized():
            return None
        try:
            return cluster_demand.work_it_would_place(*self._place())
        except Exception:  # noqa: BLE001 - a failed look is no reason to end; the next one tries again
            log.debug("Looking for work waiting for this replica's resources failed.", exc_info=True)
            return None

    def _cancel(self, job_id: str, why: str) -> None:
        tasks = self._in_flight.get(job_id, set())
        if tasks:
            log.warning("Job %s %s: cancelling its %d requests.", job_id, why, len(tasks))
        for task in tasks:
            task.cancel()  # vLLM aborts a request whose caller is cancelled

    def _retire(self, why: str, orderly: bool = True) -> None:
        """Shut the engine down and end this actor (its name is then free for a new replica).

        :param orderly: shut the engine down first; False: end the actor as it is (its EngineCore ends
            with it, :mod:`.engine_lifetime`), and its rows in flight come back to their jobs as a
            dead replica's.
        """
        import ray

        if self._retiring:
            return
        self._retiring = True
        # First: should the engine's shutdown hang, or Ray's kill not come, the process still ends
        # (calls that wait for the end in _refuse_if_retiring must not wait forever).
        threading.Timer(10.0, os._exit, (0,)).start()
        log.warning("Engine pool replica %s retires: %s.", self._fingerprint, why)
        if orderly:
            with contextlib.suppress(Exception):  # best effort: the actor's end kills what is left
                self._engine.llm.shutdown()
        me = ray.get_runtime_context().current_actor
        # A moment later: a retire_if_idle call still gets its answer.
        threading.Timer(0.2, lambda: ray.kill(me, no_restart=True)).start()


class _JobShare:
    """One job's places in the replica's engine (:data:`JOB_SHARE_IN_RUNNING_BATCHES`), in sequences.

    A row takes as many places as the sequences it puts into the engine, at most the whole share: a row
    larger than the share still runs, alone within it. Places go first come, first served, so a large
    row is not held back for ever by the job's smaller rows behind it.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._free = size
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    @contextlib.asynccontextmanager
    async def held(self, sequences: int) -> AsyncIterator[None]:
        """Hold places for ``sequences`` (capped at the share) while the block runs."""
        places = min(sequences, self._size)
        if self._waiting or places > self._free:
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append((places, waiter))
            try:
                await waiter
            except asyncio.CancelledError:  # the job's lease ended, or its caller went away
                if not waiter.cancelled():  # its places came just as it was cancelled
                    self._give_back(places)
                self._wake()  # it may have been first in line, holding back rows behind it
                raise
        else:
            self._free -= places
        try:
            yield
        finally:
            self._give_back(places)

    def _give_back(self, places: int) -> None:
        self._free += places
        self._wake()

    def _wake(self) -> None:
        while self._waiting:
            places, waiter = self._waiting[0]
            if not waiter.cancelled() and places > self._free:
                return
            self._waiting.popleft()
            if not waiter.cancelled():
                self._free -= places
                waiter.set_result(None)


def _sequences(row: Row) -> int:
    """The sequences ``row`` puts into the engine: its sampling ``n`` (``best_of`` where larger) for
    each of its inputs (an embeddings line's inputs after the first are requests of their own,
    :mod:`.engine_actor`). A value the engine would refuse counts as 1: the row fails there."""
    params = _decoded(row.get("sampling_params"))
    per_input = 1
    if isinstance(params, dict):
        per_input = max(_count(params.get("n")), _count(params.get("best_of")))
    extra_inputs = _decoded(row.get(EXTRA_INPUTS))
    return per_input * (1 + (len(extra_inputs) if isinstance(extra_inputs, list) else 0))


def _decoded(value: Any) -> Any:  # Any: a row's column, JSON text on the way here (row_steps.engine_request)
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return None


def _count(value: Any) -> int:  # Any: a row's sampling parameter (vLLM takes an int only)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 1 else 1


#: One id for every row this replica answers (Ray Data LLM logs it per batch; a pool has no batches).
_BATCH = uuid.UUID(int=0)


def _portable(output: Row) -> Row:
    """The output row without torch values, so the job's stage (which never imports torch) can read it."""
    embeddings = output.get("embeddings")
    if embeddings is not None and hasattr(embeddings, "tolist"):
        output["embeddings"] = embeddings.tolist()
    return output


def _max_num_seqs(engine: Any, engine_kwargs: dict[str, Any]) -> int:  # Any: Ray Data LLM's UDF; its keywords
    """The built engine's running-batch bound (vLLM's scheduler config), else the settings', else vLLM's
    usual default."""
    with contextlib.suppress(AttributeError, TypeError):
        return int(engine.llm.engine.vllm_config.scheduler_config.max_num_seqs)
    configured = (engine_kwargs.get("engine_kwargs") or {}).get("max_num_seqs")
    return int(configured) if isinstance(configured, int) and configured > 0 else _DEFAULT_MAX_NUM_SEQS


def _bounded_keep_warm(keep_warm_seconds: float) -> float:
    """``keep_warm_seconds`` as a job's spec allows it. The replica checks again: anyone who can
    submit to the cluster can call it by name, and NaN or a year would keep it from ever ending.

    :raises ValueError: naming the value and the bound.
    """
    value = float(keep_warm_seconds)
    if not 0.0 <= value <= KEEP_WARM_SECONDS_LIMIT:  # NaN fails both comparisons
        raise ValueError(
            f"keep_warm_seconds={keep_warm_seconds!r} must be from 0 to {KEEP_WARM_SECONDS_LIMIT:,}"
        )
    return value


@dataclasses.dataclass(frozen=True)
class _ModelOfEngine:
    """The model a replica's engine was built on, which a job's chat template must load: a replica's
    name is no secret (docs/security.md), and an attach that named another folder, with
    ``trust_remote_code``, ran that folder's tokenizer code in the process holding every sharing job's
    rows."""

    source: object
    trust_remote_code: bool
    copy_root: str | None

    def check_chat_template(self, settings: dict[str, Any]) -> None:
        """:raises ValueError: ``settings`` load another model, or its code where the engine runs none,
        or skip the model copy's check the engine made."""
        if settings.get("model") != self.source:
            raise ValueError(
                f"a chat template of model {settings.get('model')!r} on a replica of {self.source!r}: "
                "a job renders with its engine's own model"
            )
        if settings.get("trust_remote_code") and not self.trust_remote_code:
            raise ValueError(
                "a chat template with trust_remote_code on a replica whose engine runs no model code"
            )
        if settings.get(MODEL_COPY_KWARG) != self.copy_root:
            raise ValueError("a chat template that skips the check of the replica's model copy")


def chat_template_key(settings: dict[str, Any]) -> str:
    """One chat template's settings as a key: equal settings, one loaded template."""
    return json.dumps(settings, sort_keys=True, default=str)


def _chat_template_udf(settings: Kwargs) -> RaybatchChatTemplateUDF:
    """The job's chat-template UDF; one that checks a fetched model copy first where the job's
    settings name one (:mod:`.checked_stages`)."""
    from airflow_provider_raybatch.pipeline.generate.checked_stages import CheckedChatTemplateUDF

    return CheckedChatTemplateUDF(data_column="__data", expected_input_keys=[], **settings)
