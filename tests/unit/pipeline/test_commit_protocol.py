"""The commit protocol as a state machine: random sequences of tries, kills, inputs rewritten in place,
runs re-created while their job runs, code and threshold changes, and a second run of the date (a
manual run beside the scheduled one) publishing at the same moment (hypothesis' RuleBasedStateMachine).

Each try is what ``run._run_owned`` does, through the pipeline's own staging calls
(``ownership.claim``, ``commit.take_held``, ``commit.open_staging_parts``, ``PartWriter.write_part``,
``commit.write_version``, ``commit.hold`` / ``ownership.confirm`` + ``commit.publish``), with a stand-in
for the engine (each row's output names the code that made it; every fifth id fails) and for Ray's job
table (which jobs live; at times it cannot be read). Each try's driver runs on a node whose clock may be
far behind or ahead of the others', and a live owner's heartbeat goes on as time passes: a try takes a
run's staging only from a job the table says ended, never by a heartbeat's age. Input changes bump
each file's modification time, as time passes between tries, but for one rule's: a file rewritten in
place with as many bytes and its modification time set back (``rsync -t``, ``cp -p``). The input's
digest is the real one (``prepared_cache.input_digest``), on real files. After every step:

- a reader following ``manifest.json`` finds a whole version: its files hold exactly the rows its
  counts say;
- a version committed holds each row of the input exactly once (an output or an error), as the input
  is when it commits (a try whose input changed under it commits nothing), and nothing from another
  input or another code;
- no version is left behind: each version folder is the current one or one a run's staging still
  writes into (a try in progress, killed or held); whatever two publishes at once did.

Two publishes at once run in threads, one storage call at a time, in an order hypothesis draws
(tests/unit/pipeline/interleave.py). A try may die part way through its commit (after any number of
its storage calls: in ``write_version``, ``hold`` or ``publish``), and a dead try's replica may stage
a last part after a newer try took the run over (its job ended, the replica not yet: a node cut off
from Ray but not from the store).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import event, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.pipeline.read import prepared_cache
from airflow_provider_raybatch.pipeline.stage import commit, ownership, reuse
from airflow_provider_raybatch.pipeline.stage.binding import (
    InputChangedError,
    RunBinding,
    check_input_unchanged,
)
from airflow_provider_raybatch.pipeline.stage.parts import PartWriter, StagingTakenError
from airflow_provider_raybatch.pipeline.storage import OutputLayout
from airflow_provider_raybatch.shared.manifest import HELD_STATUS
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec
from tests.unit.pipeline.interleave import GATED, interleave

RUN_KEY = "daily-2026-11-20"
#: A second run of the same date (triggered by hand): its own run key, the same output.
MANUAL_RUN_KEY = "daily-manual-2026-11-20"
ids = st.text("abcdefgh", min_size=1, max_size=3)


@dataclass
class Try:
    """A job of the run: what it read, what it made its rows with, what it has staged."""

    job_id: str
    layout: OutputLayout
    owner: ownership.Owner
    spec: BatchInferenceSpec
    binding: RunBinding
    code: int
    input_state: tuple  # the input files as it read them (:meth:`CommitProtocol._input_state`)
    rows: list[tuple[str, str]]  # (source, id) of every input row it read, in order
    todo: list[tuple[str, str]]  # those it has still to stage
    writer: PartWriter
    clock_offset: float = 0.0  # how far its node's clock is from the true time
    parts: frozenset[str] = frozenset()  # the parts its commit listed (commit.CommittedRun.part_names)


class Crash(Exception):
    """The try's process dies here: the storage call it was about to make never happens."""


@dataclass
class Clock:
    """Time for ownership's waits: a sleep advances it, and the live owners' heartbeats go on."""

    now: float = 1_000_000.0
    on_sleep: Callable[[], None] | None = None

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep()


class _NamingClock:
    """Deterministic stand-ins for the names storage draws (version and part names take the time and a
    random uuid): hypothesis replays a failing sequence only where the same draws give the same run,
    and a name's sort order decides which version or part a listing meets first."""

    def __init__(self) -> None:
        self._counter: Iterator[int] = itertools.count(1)
        self._lock = threading.Lock()  # the commit's sidecar readers draw from threads

    def uuid4(self) -> uuid.UUID:
        with self._lock:
            n = next(self._counter)
        return uuid.UUID(int=n << 104)  # its hex starts with n: the names keep its first 6 or 8

    def now(self, tz: object = None) -> datetime:
        with self._lock:
            n = next(self._counter)
        return datetime(2026, 11, 21, tzinfo=UTC) + timedelta(seconds=n)


class CommitProtocol(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        naming = _NamingClock()
        self._real_names = (uuid.uuid4, storage.datetime)
        uuid.uuid4 = naming.uuid4  # type: ignore[assignment]
        storage.datetime = naming  # type: ignore[assignment]
        self.root = Path(tempfile.mkdtemp(prefix="raybatch-protocol-"))
        self.input = self.root / "in"
        self.input.mkdir()
        self.layout = OutputLayout(str(self.root / "out"), RUN_KEY)
        self.files: dict[str, list[str]] = {}
        self.mtime = 1_700_000_000
        self.code = 0
        self.max_failed_fraction = 0.5
        self.clock = Clock(on_sleep=self._beat)
        self.alive: dict[str, bool] = {}  # Ray's job table: job id -> still running
        self.job_table_readable = True  # else Ray cannot say whether any job lives
        self.node_clock = 0.0  # the offset of the clock on the node the next try's driver runs on
        self.tries: dict[str, Try] = {}
        self.jobs = 0
        self.committed_input_state: tuple | None = None
        # version -> the rows its try read and the code it made them with
        self.committed: dict[str, tuple[list[tuple[str, str]], int]] = {}
        #: The Airflow run each version's job was submitted for, its run_after changing when the run is
        #: deleted and triggered again under its run id (the run key stays).
        self.committed_runs: dict[str, dict[str, str]] = {}
        self.run_after = 0
        #: A try died in its commit, and no publish has finished since: its debris (a version its manifest
        #: named, replaced before it was listed for collection) waits for the next publish.
        self.died_since_publish = False
        #: A late writer stalled through a commit and died after writing into the version it committed:
        #: its files are in the version's folders, listed nowhere, until the next try starts.
        self.stray_files = False
        self._write_file("a.jsonl", ["a", "b", "c", "d", "e"])

    def teardown(self) -> None:
        uuid.uuid4, storage.datetime = self._real_names  # type: ignore[assignment]
        shutil.rmtree(self.root, ignore_errors=True)

    # -- the input ------------------------------------------------------------------------------

    def _write_file(self, name: str, row_ids: list[str]) -> None:
        path = self.input / name
        path.write_text("".join(json.dumps({"id": row_id}) + "\n" for row_id in row_ids))
        self.mtime += 10  # time passes between writes, as between tries
        os.utime(path, (self.mtime, self.mtime))
        self.files[name] = list(row_ids)

    def _input_state(self) -> tuple:
        """The input files as they are: each one's name, rows, modification and status-change times (a
        file added, then deleted, leaves the input as it was; a file written again is another input,
        even with the rows it had: the digest reads no content)."""
        stats = {name: (self.input / name).stat() for name in self.files}
        return tuple(
            (name, tuple(self.files[name]), stats[name].st_mtime_ns, stats[name].st_ctime_ns)
            for name in sorted(self.files)
        )

    def _rows(self) -> list[tuple[str, str]]:
        return [
            (f"{name}:{line}", row_id)
            for name in sorted(self.files)
            for line, row_id in enumerate(self.files[name], start=1)
        ]

    @rule(data=st.data())
    def rewrite_input(self, data: st.DataObject) -> None:
        """Upstream delivers the input again in place: a row inserted, removed, rows reordered, a file
        added or deleted."""
        names = sorted(self.files)
        ops = ["insert", "add_file"] + (["remove", "reorder"] if any(self.files.values()) else [])
        ops += ["delete_file"] if len(names) > 1 else []
        op = data.draw(st.sampled_from(ops))
        if op == "add_file":
            name = f"{data.draw(st.sampled_from('bcd'))}.jsonl"
            self._write_file(name, data.draw(st.lists(ids, max_size=4)))
        elif op == "delete_file":
            name = data.draw(st.sampled_from(names))
            (self.input / name).unlink()
            del self.files[name]
        else:
            name = data.draw(
                st.sampled_from([n for n in names if self.files[n]] if op != "insert" else names)
            )
            rows = list(self.files[name])
            if op == "insert":
                rows.insert(data.draw(st.integers(0, len(rows))), data.draw(ids))
            elif op == "remove":
                rows.pop(data.draw(st.integers(0, len(rows) - 1)))
            else:
                rows = data.draw(st.permutations(rows))
            self._write_file(name, rows)

    @precondition(lambda self: any(self.files.values()))
    @rule(data=st.data())
    def rewrite_input_keeping_size_and_mtime(self, data: st.DataObject) -> None:
        """Upstream rewrites a file in place with as many bytes and sets its modification time back
        (``rsync -t``, ``cp -p``): two different rows swapped, or an id replaced by another as long.
        Path, size and modification time are as they were; only the file's status-change time is not."""
        name = data.draw(st.sampled_from(sorted(name for name, rows in self.files.items() if rows)))
        rows = list(self.files[name])
        swaps = [(i, j) for i in range(len(rows)) for j in range(i + 1, len(rows)) if rows[i] != rows[j]]
        if swaps and data.draw(st.booleans()):
            i, j = data.draw(st.sampled_from(swaps))
            rows[i], rows[j] = rows[j], rows[i]
        else:
            line = data.draw(st.integers(0, len(rows) - 1))
            old = rows[line]
            rows[line] = data.draw(
                st.text("abcdefgh", min_size=len(old), max_size=len(old)).filter(lambda new: new != old)
            )
        path = self.input / name
        before = path.stat()
        path.write_text("".join(json.dumps({"id": row_id}) + "\n" for row_id in rows))
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        # Before Linux 6.13 the kernel stamps ctime from a clock that ticks once a jiffy: a rewrite in
        # the tick of the file's last change keeps its ctime, where between two tries a tick passes.
        while path.stat().st_ctime_ns == before.st_ctime_ns:
            time.sleep(0.005)
            os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = path.stat()
        assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
        self.files[name] = rows
        event("an input file rewritten in place, keeping its size and modification time")

    # -- the run's settings ---------------------------------------------------------------------

    @rule()
    def delete_and_trigger_the_run_again(self) -> None:
        """The run is deleted and triggered again under its run id: a new run_after, the same run key
        (its staging); a live job of the deleted run goes on until it ends."""
        self.run_after += 1

    @rule()
    def change_code(self) -> None:
        """A preprocess fixed under the same dotted path: the shipped code's digest changes."""
        self.code += 1

    @rule(fraction=st.sampled_from([0.05, 0.5]))
    def change_thresholds(self, fraction: float) -> None:
        self.max_failed_fraction = fraction

    # -- tries ----------------------------------------------------------------------------------

    def _spec(self, run_key: str = RUN_KEY) -> BatchInferenceSpec:
        return BatchInferenceSpec.build(
            model="m",
            input_uri=str(self.input),
            output_uri=self.layout.output_uri,
            run_key=run_key,
            input_format="jsonl",
            user_template="{id}",
            id_column="id",
            max_failed_fraction=self.max_failed_fraction,
        )

    def _job_alive(self, job_id: str) -> bool | None:
        return self.alive.get(job_id, False) if self.job_table_readable else None

    def _beat(self) -> None:
        """Each live owner's driver renews its heartbeat, on its own node's clock, as time passes."""
        for job in self.tries.values():
            owner = ownership.read_owner(job.layout)
            if self.alive.get(job.job_id) and owner is not None and owner.job_id == job.job_id:
                ownership._write(
                    job.layout, ownership.Owner(job.job_id, job.owner.run, self.clock.now + job.clock_offset)
                )

    @rule(readable=st.booleans())
    def rays_job_table(self, readable: bool) -> None:
        """Ray's job table cannot be read for a while (a head restarting), or can again."""
        self.job_table_readable = readable

    @rule(offset=st.sampled_from([-10_000.0, -121.0, 0.0, 121.0, 10_000.0]))
    def a_nodes_clock_is_skewed(self, offset: float) -> None:
        """The next try's driver runs on a node whose clock is behind or ahead of the others'."""
        self.node_clock = offset

    @precondition(lambda self: bool(self.files))
    @rule(take_committed=st.booleans())
    def start_try(self, take_committed: bool) -> None:
        """A new job of the run: a retry, a clear, or a re-created run's try while another job lives;
        with ``reuse_earlier_result`` (``take_committed``), whether or not Ray's job table still knows
        the earlier jobs."""
        self._start(self.layout, take_committed)

    def _start(self, layout: OutputLayout, take_committed: bool = False) -> Try | None:
        """A job of the run ``layout`` names, as run._run_owned starts; None where it ends at once."""
        self.jobs += 1
        job_id = f"job-{self.jobs}"
        self.alive[job_id] = True
        spec = self._spec(layout.run_key)
        digest = prepared_cache.input_digest(str(self.input), ["jsonl"])
        binding = RunBinding(spec=spec.fingerprint(), input=digest, code=str(self.code), model="m")
        offset = self.node_clock
        run = {
            "dag_id": "daily",
            "task_id": "classify",
            "run_id": layout.run_key,
            "map_index": "-1",
            "run_after": str(self.run_after),
            "try_number": str(self.jobs),
        }
        owner = ownership.Owner(job_id, run, self.clock.now + offset)
        live = [t for t, job in self.tries.items() if job.layout == layout and self.alive.get(t)]
        try:
            ownership.claim(
                layout, owner, self._job_alive, now=lambda: self.clock.now + offset, sleep=self.clock.sleep
            )
        except ownership.StagingOwnedError:
            assert live or not self.job_table_readable, "refused though no other job lives"
            event("a second live job of the run refused" if live else "refused while Ray could not say")
            self.alive[job_id] = False  # fails before writing anything
            return None
        # Only a job Ray's job table says ended (or does not know) gives its staging up: no clock does.
        assert not live, f"took live job {live}'s staging (job table readable: {self.job_table_readable})"
        if commit.sweep_current_version(layout):
            event("a late writer's files removed from the committed version as a try started")
        self.stray_files = False
        this_run = reuse.airflow_run(run)
        earlier = reuse.committed_result(layout, spec, binding, this_run) if take_committed else None
        if earlier is not None:
            # Taken only when it holds the input as it is now, made by the code as it is now, for this run.
            version = str(earlier["version"])
            assert version == commit.current_version(self.layout), "took a version that is not current"
            assert self.committed_runs[version] == this_run, "took the version of a run deleted since"
            assert self.committed[version][1] == self.code, "took a version made by another code"
            assert self._input_state() == self.committed_input_state, "took a version of another input"
            event("a retry took the committed version, generating nothing")
            ownership.release(layout, owner)
            self.alive[job_id] = False
            return None
        held = commit.take_held(layout, spec, binding)
        if held is not None and not held.passes:
            event("a held run held again, generating nothing")
            self.alive[job_id] = False
            return None
        if held is not None:
            event("a held run's rows taken by looser thresholds")
        done = {
            source
            for part in commit.open_staging_parts(layout, spec, binding)
            for source in part.sidecar["sources"]
        }
        writer = PartWriter(
            layout.staging_uri, "jsonl", count_labels=True, data_uri=commit.staged_data_uri(layout)
        )
        writer.create_folders()
        rows = self._rows()
        todo = [row for row in rows if row[0] not in done]
        if len(todo) < len(rows):
            event("a try resumed staged rows")
        job = Try(
            job_id, layout, owner, spec, binding, self.code, self._input_state(), rows, todo, writer, offset
        )
        self.tries[job_id] = job
        return job

    def _live(self) -> list[str]:
        return sorted(job_id for job_id in self.tries if self.alive.get(job_id))

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data(), count=st.integers(1, 4))
    def stage_some(self, data: st.DataObject, count: int) -> None:
        """The engine finishes a few rows of a live try, and its replica stages them as one part."""
        job = self.tries[data.draw(st.sampled_from(self._live()))]
        batch, job.todo = job.todo[:count], job.todo[count:]
        if batch:
            job.writer.write_part([self._result(source, row_id, job.code) for source, row_id in batch])

    @staticmethod
    def _result(source: str, row_id: str, code: int) -> dict[str, object]:
        if zlib.crc32(row_id.encode()) % 5 == 0:  # a row's fault: an error row with its reason
            record = {"id": row_id, "source": source, "error": "empty prompt: stand-in"}
            return {"source": source, "ok": False, "record": json.dumps(record)}
        record = {"id": row_id, "generated_text": f"code{code}:{row_id}", "source": source}
        return {"source": source, "ok": True, "record": json.dumps(record), "tokens": [1, 1]}

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data())
    def kill(self, data: st.DataObject) -> None:
        """A try's job dies (stopped, crashed, its node lost) wherever it was."""
        self.alive[data.draw(st.sampled_from(self._live()))] = False

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data(), count=st.integers(1, 4))
    def killed_after_staging_and_retried(self, data: st.DataObject, count: int) -> None:
        """The common failure: a try stages some rows, its job dies, and Airflow retries the task (the
        sequence the other rules reach only now and then, here in one step)."""
        job_id = data.draw(st.sampled_from(self._live()))
        job = self.tries[job_id]
        batch, job.todo = job.todo[:count], job.todo[count:]
        if batch:
            job.writer.write_part([self._result(source, row_id, job.code) for source, row_id in batch])
        self.alive[job_id] = False
        self._start(job.layout)

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        """A live try stages what is left and commits (or holds) its run."""
        job = self.tries[data.draw(st.sampled_from(self._live()))]
        manifest = self._write_version(job)
        if manifest is not None:
            commit.publish(job.layout, manifest, keep_versions=False, committed_parts=job.parts)
            self._published(job, manifest)

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data())
    def finish_beside_a_manual_run_of_the_date(self, data: st.DataObject) -> None:
        """A live try and a manual run of the same date (its own run key, the same output) finish at the
        same moment: their publishes run side by side, storage call by storage call, in any order."""
        job = self.tries[data.draw(st.sampled_from(self._live()))]
        manual = self._start(OutputLayout(self.layout.output_uri, MANUAL_RUN_KEY))
        jobs = [one for one in (job, manual) if one is not None]
        ready = [(one, manifest) for one in jobs if (manifest := self._write_version(one)) is not None]
        interleave(
            {
                one.job_id: (
                    lambda one=one, manifest=manifest: commit.publish(one.layout, manifest, False, one.parts)
                )
                for one, manifest in ready
            },
            choose=lambda waiting: data.draw(st.sampled_from(waiting)),
        )
        for one, manifest in ready:
            self._published(one, manifest)
        if len(ready) == 2:
            event("two runs of the date published at the same moment")
        now = commit.current_version(self.layout)
        assert now in {manifest["version"] for _, manifest in ready} or not ready
        for _, manifest in ready:
            # The one not current is gone: its task fails naming the commit that replaced it
            # (operators/job_results.check_not_superseded), never hands on a version no longer current.
            assert (
                manifest["version"] == now or not Path(self.layout.version_uri(manifest["version"])).exists()
            )

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data(), calls=st.integers(0, 40))
    def die_part_way_through_the_commit(self, data: st.DataObject, calls: int) -> None:
        """A live try stages what is left and commits, and dies after ``calls`` storage calls of it
        (where it had more to make): a reader still finds a whole version, and a later try finishes."""
        job = self.tries[data.draw(st.sampled_from(self._live()))]
        made = 0
        counting = threading.Lock()  # the commit reads its parts' sidecars from threads

        def counted(function: Callable[..., object]) -> Callable[..., object]:
            def call(*args: object, **kwargs: object) -> object:
                nonlocal made
                with counting:
                    if made >= calls:
                        raise Crash
                    made += 1
                return function(*args, **kwargs)

            return call

        originals = {name: getattr(storage, name) for name in GATED}
        for name, original in originals.items():
            setattr(storage, name, counted(original))
        manifest, died = None, False
        try:
            manifest = self._write_version(job)
            if manifest is not None:
                commit.publish(job.layout, manifest, keep_versions=False, committed_parts=job.parts)
        except Crash:
            died = True
        finally:
            for name, original in originals.items():
                setattr(storage, name, original)
        if not died:
            if manifest is not None:
                self._published(job, manifest)
            return
        self.alive[job.job_id] = False
        self.died_since_publish = True
        event("a try died part way through its commit")
        if manifest is not None and commit.current_version(self.layout) == manifest["version"]:
            self._record(job, manifest)  # its manifest was written: the version is current
            event("a try died after its manifest was written")

    @precondition(lambda self: any(not self.alive[t] and job.todo for t, job in self.tries.items()))
    @rule(data=st.data(), count=st.integers(1, 3))
    def a_dead_tries_replica_stages_late(self, data: st.DataObject, count: int) -> None:
        """A try's job has ended (Ray's job table says so, and a newer try may have taken the staging
        over), but one of its replicas, cut off from Ray and not from the store, stages a last part."""
        dead = sorted(t for t, job in self.tries.items() if not self.alive[t] and job.todo)
        job = self.tries[data.draw(st.sampled_from(dead))]
        batch, job.todo = job.todo[:count], job.todo[count:]
        try:
            job.writer.write_part([self._result(source, row_id, job.code) for source, row_id in batch])
        except StagingTakenError:
            event("a dead try's late part refused: its staging was started afresh or committed")
        else:
            event("a dead try's late part staged, for the next try to resume")

    @precondition(
        lambda self: (
            bool(self._live()) and any(not self.alive[t] and job.todo for t, job in self.tries.items())
        )
    )
    @rule(data=st.data(), count=st.integers(1, 3))
    def finish_while_a_dead_tries_replica_stages_late(self, data: st.DataObject, count: int) -> None:
        """A live try commits while a dead try's replica (cut off from Ray, not from the store) stages a
        last part, their storage calls in any order: before the commit lists the parts, the late part is
        one more part (its repeats dropped); after, it never lands in the version."""
        job = self.tries[data.draw(st.sampled_from(self._live()))]
        dead = sorted(t for t, one in self.tries.items() if not self.alive[t] and one.todo)
        # One that stages into the version being committed where there is one: the case that matters.
        same_version = [t for t in dead if self.tries[t].writer.data_uri == job.writer.data_uri]
        late_try = self.tries[data.draw(st.sampled_from(same_version or dead))]
        batch, late_try.todo = late_try.todo[:count], late_try.todo[count:]
        said: list[str] = []  # hypothesis records events in the test's own thread only

        def stage_late() -> None:
            rows = [self._result(source, row_id, late_try.code) for source, row_id in batch]
            try:
                late_try.writer.write_part(rows)
            except StagingTakenError:
                said.append("a late part across a commit refused")

        done = interleave(
            {"commit": lambda: self._write_version(job, said), "late": stage_late},
            choose=lambda waiting: data.draw(st.sampled_from(waiting)),
        )
        for name in said:
            event(name)
        manifest = done["commit"]
        if manifest is not None:
            commit.publish(job.layout, manifest, keep_versions=False, committed_parts=job.parts)
            self._published(job, manifest)

    def _late_writers_into_a_live_version(self) -> list[tuple[str, str]]:
        """(live try, dead try with rows left) pairs staging into one version folder: a dead try's
        replica whose part would land in the version the live try commits."""
        return [
            (live, dead)
            for live in self._live()
            for dead in sorted(self.tries)
            if not self.alive[dead]
            and self.tries[dead].todo
            and self.tries[dead].writer.data_uri == self.tries[live].writer.data_uri
        ]

    @precondition(lambda self: bool(self._late_writers_into_a_live_version()))
    @rule(data=st.data(), count=st.integers(1, 3))
    def a_late_writer_stalls_through_a_commit_and_dies(self, data: st.DataObject, count: int) -> None:
        """A dead try's replica (cut off from Ray, not from the store) checks its staging, stalls while a
        live try commits and publishes, writes its part, and dies before its second check: its files sit
        in the version's folders, outside the parts list, until the next try of the output removes them."""
        live, dead = data.draw(st.sampled_from(self._late_writers_into_a_live_version()))
        job, late_try = self.tries[live], self.tries[dead]
        batch, late_try.todo = late_try.todo[:count], late_try.todo[count:]
        manifest: dict[str, object] | None = None
        checks = 0

        delete_file = storage.delete_file

        def dead_process_deletes_nothing(uri: str, within: str | None = None) -> None:
            raise Crash  # the writer's clean-up after its second check never runs: it is dead

        def stalled_check() -> None:
            nonlocal manifest, checks
            checks += 1
            if checks > 1:  # dies after writing, at the check that would remove its part
                storage.delete_file = dead_process_deletes_nothing  # type: ignore[assignment]
                raise Crash
            PartWriter.check_still_staging(late_try.writer)  # its first check, as it is now
            manifest = self._write_version(job)  # the whole commit, while the replica stalls
            if manifest is not None:
                commit.publish(job.layout, manifest, keep_versions=False, committed_parts=job.parts)

        late_try.writer.check_still_staging = stalled_check  # type: ignore[method-assign]
        try:
            late_try.writer.write_part(
                [self._result(source, row_id, late_try.code) for source, row_id in batch]
            )
        except StagingTakenError:
            event("a late writer refused at its first check: its staging was started afresh or committed")
            return
        except Crash:
            pass
        finally:
            del late_try.writer.check_still_staging
            storage.delete_file = delete_file  # type: ignore[assignment]
        if manifest is None:
            return
        self._published(job, manifest)
        self.stray_files = True
        event("a late writer's part landed in the committed version, listed nowhere")
        if data.draw(st.booleans(), label="the run is tried again at once"):
            self._start(self.layout, take_committed=data.draw(st.booleans()))

    def _write_version(self, job: Try, said: list[str] | None = None) -> dict[str, object] | None:
        """The try stages what is left and writes its version; the manifest to publish, or None where
        the try commits nothing (its input changed under it) or holds its rows.

        :param said: where to put the events, for a caller that runs this in another thread.
        """
        say = event if said is None else said.append
        if job.todo:
            job.writer.write_part([self._result(source, row_id, job.code) for source, row_id in job.todo])
            job.todo = []
        run = commit.write_version(job.layout, job.spec, len(job.rows), rewriter=job.writer)
        commit.seal(job.layout, run)  # as run.py: no part lands in the version after its listing
        job.parts = run.part_names
        self.alive[job.job_id] = False
        manifest = {
            "version": run.version,
            "rows_in": len(job.rows),
            "rows_out": run.rows_out,
            "rows_failed": run.rows_failed,
            "errors_by_reason": run.errors_by_reason,
            "outputs_uri": run.outputs_uri,
            "errors_uri": run.errors_uri,
            "id_column": "id",
            "spec_fingerprint": job.binding.spec,
            "binding": job.binding.as_dict(),
            "run_key": job.layout.run_key,
            reuse.AIRFLOW_RUN_KEY: reuse.airflow_run(job.owner.run),
        }
        digest_now = prepared_cache.input_digest(str(self.input), ["jsonl"])
        try:
            check_input_unchanged(job.binding, digest_now, str(self.input))
        except InputChangedError:
            assert self._input_state() != job.input_state, "refused an input that did not change"
            say("an input changed under a try: nothing committed")
            return None  # the job fails, committing nothing; the next try discards its rows
        assert self._input_state() == job.input_state, "an input changed under the job went unnoticed"
        if run.held:
            commit.hold(job.layout, {**manifest, "status": HELD_STATUS})
            say("a run held")
            return None
        ownership.confirm(job.layout, job.owner)
        return {**manifest, "status": "complete"}

    def _published(self, job: Try, manifest: dict[str, object]) -> None:
        self.died_since_publish = False
        ownership.release(job.layout, job.owner)
        self._record(job, manifest)
        event("a version committed")

    def _record(self, job: Try, manifest: dict[str, object]) -> None:
        """What a version whose manifest was written holds: the rows its try read, its code."""
        self.committed[str(manifest["version"])] = (job.rows, job.code)
        self.committed_runs[str(manifest["version"])] = reuse.airflow_run(job.owner.run) or {}
        if manifest["version"] == commit.current_version(self.layout):
            self.committed_input_state = job.input_state

    # -- what must hold after every step --------------------------------------------------------

    def _version_rows(self, manifest: dict) -> tuple[list[dict], list[dict]]:
        """The version's rows as a reader of its parts list reads them (all its files, where none)."""
        listed_uri = Path(commit.parts_uri(self.layout, manifest["version"]))
        listed = set(json.loads(listed_uri.read_text())) if listed_uri.exists() else None

        def read(folder: str) -> list[dict]:
            return [
                json.loads(line)
                for path in sorted(Path(folder).glob("*.jsonl"))
                if listed is None or path.name.split(".", 1)[0] in listed
                for line in path.read_text().splitlines()
            ]

        return read(manifest["outputs_uri"]), read(manifest["errors_uri"])

    @invariant()
    def a_reader_finds_a_whole_version_of_one_input_and_one_code(self) -> None:
        manifest_path = Path(self.layout.manifest_uri)
        if not manifest_path.exists():
            return
        manifest = json.loads(manifest_path.read_text())
        outputs, errors = self._version_rows(manifest)
        assert (len(outputs), len(errors)) == (manifest["rows_out"], manifest["rows_failed"])
        rows, code = self.committed[manifest["version"]]
        # every row its try read, exactly once, as an output or an error
        assert sorted(row["source"] for row in outputs + errors) == sorted(source for source, _ in rows)
        by_source = dict(rows)
        assert all(row["id"] == by_source[row["source"]] for row in outputs + errors)
        # nothing made by another code
        assert all(row["generated_text"] == f"code{code}:{row['id']}" for row in outputs)
        if self._input_state() == self.committed_input_state:  # the input as it is now
            assert sorted(rows) == sorted(self._rows())

    @invariant()
    def a_folder_reader_finds_only_listed_parts(self) -> None:
        """A reader of the current version's whole folders meets only its listed parts, but after a late
        writer stalled through the commit and died, until the next try starts."""
        version = commit.current_version(self.layout)
        if version is None or self.stray_files:
            return
        listed = set(json.loads(Path(commit.parts_uri(self.layout, version)).read_text()))
        folders = Path(self.layout.version_uri(version))
        found = {
            path.name.split(".", 1)[0]
            for folder in ("outputs", "errors")
            for path in (folders / folder).glob("*")
        }
        assert found <= listed, f"files outside the parts list: {sorted(found - listed)}"

    @invariant()
    def no_version_is_left_behind(self) -> None:
        """Each version folder is the current one, or one a run's staging writes into (in progress,
        killed or held: a retry takes or discards it); a replaced version is deleted, by the next
        publish where a try died in its own."""
        if self.died_since_publish:
            return
        versions = Path(self.layout.output_uri, "versions")
        folders = {path.name for path in versions.iterdir()} if versions.exists() else set()
        staged = {
            json.loads(path.read_text())[commit.STAGED_VERSION_KEY]
            for path in Path(self.layout.output_uri, "_staging").glob("*/spec.json")
        }
        assert folders <= {commit.current_version(self.layout), *staged}


TestCommitProtocol = CommitProtocol.TestCase
TestCommitProtocol.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)
