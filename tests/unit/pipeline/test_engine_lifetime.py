"""pipeline/generate/engine_lifetime.py: the forked EngineCore ends with its replica, and shows its title.

A helper interpreter stands in for the replica actor: it starts our forkserver and, from it, an
"EngineCore" (:func:`_engine_core`) that starts a spawned "worker", as vLLM's does. The tests kill
only the processes they started, each recorded with its start time (psutil checks it before a signal).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from airflow_provider_raybatch.pipeline.generate import engine

ROOT = Path(__file__).resolve().parents[3]

#: What the helper "replica" runs: the EngineCore from our forkserver context, then, like the replica
#: that keeps vLLM's process handles, it keeps its own and runs multiprocessing's clean-up and the
#: garbage collector again and again (what would close the EngineCore's parent sentinel too early).
_REPLICA = """
import gc, json, multiprocessing, sys, time
from multiprocessing import forkserver, resource_tracker
from pathlib import Path
from airflow_provider_raybatch.pipeline.generate import engine
from tests.unit.pipeline.test_engine_lifetime import _engine_core

out, on_sigterm = Path(sys.argv[1]), sys.argv[2]
process = engine._forkserver_context().Process(target=_engine_core, args=(str(out), on_sigterm))
process.start()
while not (out / "engine.json").exists():
    time.sleep(0.05)
pids = json.loads((out / "engine.json").read_text())
pids["forkserver"] = forkserver._forkserver._forkserver_pid
pids["resource_tracker"] = resource_tracker._resource_tracker._pid
(out / "replica.json.tmp").write_text(json.dumps(pids))
(out / "replica.json.tmp").rename(out / "replica.json")
while True:
    gc.collect()
    multiprocessing.active_children()
    time.sleep(0.2)
"""


def _engine_core(out: str, on_sigterm: str) -> None:  # runs in the forked "EngineCore"
    import multiprocessing

    worker = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(600,))
    if on_sigterm == "exit":  # as vLLM's EngineCore: stop its workers, then itself

        def stop(signum: int, frame: object) -> None:
            worker.terminate()
            worker.join(10)
            os._exit(0)

        signal.signal(signal.SIGTERM, stop)
    else:  # an EngineCore stuck where SIGTERM is only recorded: the grace period ends it
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with contextlib.suppress(ImportError):  # the module before the fix has none
            from airflow_provider_raybatch.pipeline.generate import engine_lifetime

            engine_lifetime.ORPHAN_GRACE_SECONDS = 2.0
    worker.start()
    pids = json.dumps({"engine_core": os.getpid(), "worker": worker.pid})
    (Path(out) / "engine.json.tmp").write_text(pids)
    (Path(out) / "engine.json.tmp").rename(Path(out) / "engine.json")
    time.sleep(600)


def _start_replica(out: Path, on_sigterm: str) -> tuple[subprocess.Popen[bytes], dict[str, psutil.Process]]:
    replica = subprocess.Popen(
        [sys.executable, "-c", _REPLICA, str(out), on_sigterm],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    deadline = time.monotonic() + 120
    while not (out / "replica.json").exists():
        assert replica.poll() is None, "the helper replica exited before its EngineCore started"
        assert time.monotonic() < deadline, "the helper replica's EngineCore did not start in 120 s"
        time.sleep(0.1)
    pids = json.loads((out / "replica.json").read_text())
    return replica, {name: psutil.Process(pid) for name, pid in pids.items()}


def _alive(process: psutil.Process) -> bool:
    """Running and not a zombie (a container's PID 1 may never reap an orphan)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _still_alive_after(processes: dict[str, psutil.Process], seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while (alive := [name for name, process in processes.items() if _alive(process)]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.2)
    return alive


def _end(replica: subprocess.Popen[bytes], processes: dict[str, psutil.Process]) -> None:
    """Whatever the test found: end the helper and what it started (each checked against its start time)."""
    replica.kill()
    replica.wait(30)
    for process in processes.values():
        with contextlib.suppress(psutil.Error):
            process.kill()


@pytest.mark.parametrize(
    ("on_sigterm", "seconds"),
    # "exit": well inside the 20 s grace, so it is the SIGTERM that ends them; "ignore": grace set to 2 s.
    [("exit", 12.0), ("ignore", 14.0)],
)
def test_a_killed_replica_takes_its_engine_core_workers_and_forkserver_with_it(
    tmp_path: Path, on_sigterm: str, seconds: float
) -> None:
    replica, processes = _start_replica(tmp_path, on_sigterm)
    try:
        assert _still_alive_after(processes, 0) == list(processes)
        replica.kill()  # as Ray's SIGKILL of the actor, with no raylet left to clean its process group
        replica.wait(30)
        assert _still_alive_after(processes, seconds) == []
    finally:
        _end(replica, processes)


def test_the_engine_core_lives_while_its_replica_does_even_after_the_forkserver_is_killed(
    tmp_path: Path,
) -> None:
    """No early kill: Ray kills the forkserver first on a graceful exit, and multiprocessing then drops
    the process from its children (the replica's GC runs meanwhile); only the replica's end may end it."""
    replica, processes = _start_replica(tmp_path, "exit")
    try:
        processes["forkserver"].kill()
        time.sleep(4)
        engine_core = {name: processes[name] for name in ("engine_core", "worker")}
        assert _still_alive_after(engine_core, 0) == ["engine_core", "worker"]
        replica.kill()
        replica.wait(30)
        assert _still_alive_after(engine_core, 12.0) == []
    finally:
        _end(replica, processes)


def _report_title(path: str) -> None:  # runs in the forked child, as vLLM's EngineCore names itself
    import setproctitle

    setproctitle.setproctitle("VLLM::EngineCore")
    Path(path).write_bytes(Path("/proc/self/cmdline").read_bytes())
    Path(path + ".environ").write_bytes(Path("/proc/self/environ").read_bytes())


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="Linux /proc only")
def test_the_engine_core_s_title_shows(tmp_path: Path) -> None:
    """vLLM titles its EngineCore "VLLM::EngineCore"; ps must show it, not the forkserver's command line,
    and /proc/<pid>/environ must still show its variables (scripts/local_ray_cluster.sh stop reads them)."""
    pytest.importorskip("setproctitle")
    process = engine._forkserver_context().Process(target=_report_title, args=(str(tmp_path / "title"),))
    process.start()
    process.join(60)
    assert process.exitcode == 0
    assert (tmp_path / "title").read_bytes().split(b"\0")[0] == b"VLLM::EngineCore"
    assert b"\0PATH=" in b"\0" + (tmp_path / "title.environ").read_bytes()
