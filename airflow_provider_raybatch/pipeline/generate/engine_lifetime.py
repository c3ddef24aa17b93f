"""In the EngineCore our forkserver forks: its process title, and its end when its replica is gone.

:func:`~airflow_provider_raybatch.pipeline.generate.engine._run_with_environ` calls both first thing
in the forked EngineCore (and only there: spawn mode and vLLM's workers never run it).

Why the EngineCore must watch for itself: it is the replica actor's *grandchild* (actor ->
forkserver -> EngineCore -> ``VLLM::Worker``). vLLM stops it from the actor only (its
``CoreEngineProcManager.shutdown``), and Ray kills only the actor's direct children (the forkserver,
the resource tracker) or, after the actor exits, the actor's process group, which needs a live
raylet. So when the actor is SIGKILLed with no raylet left (``ray stop --force``, a node going away),
or when Ray's exit kills the forkserver first and vLLM then takes the EngineCore for dead (its
``is_alive()`` reads the forkserver's status pipe) and never signals it, the EngineCore and its
worker lived on, holding the model's memory (a GPU on a real cluster). The forkserver lived on too:
the EngineCore holds its "alive" pipe.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time

log = logging.getLogger("airflow_provider_raybatch.pipeline")

#: How long the EngineCore's own SIGTERM shutdown may take (it stops its workers: 5 s, SIGTERM, 4 s,
#: SIGKILL) before the watcher kills it and every process under it. Read when the replica is gone.
ORPHAN_GRACE_SECONDS = 20.0


def keep_process_title() -> None:
    """Let vLLM's "VLLM::EngineCore" title show; call before the environment is rebuilt.

    setproctitle finds the process's argv by walking back from ``environ[0]`` on its first use. After
    ``os.environ.clear()`` that points at a heap string, setproctitle silently does nothing, and the
    EngineCore shows the forkserver's command line in ``ps``. Its first use, here, is still in time.
    ``SPT_NOENV`` keeps it to the argv area (the forkserver's long command line) instead of writing
    over the environment too, so ``/proc/<pid>/environ`` still shows the replica's variables
    (``scripts/local_ray_cluster.sh stop`` finds a cluster's processes by them).
    """
    with contextlib.suppress(Exception):  # a title only: never fail the engine over it
        import setproctitle

        os.environ["SPT_NOENV"] = "1"  # read once, by this first use; gone with the environment rebuilt next
        setproctitle.getproctitle()


def end_with_replica() -> None:
    """Stop this process, and the processes it started, once the process that started it is gone.

    The watch is multiprocessing's parent sentinel: the read end of a pipe whose only write end is
    the ``_parent_w`` the replica keeps (``popen_forkserver.Popen._launch``: it closes its other copy
    once it has written the process object; the forkserver never gets either, and they are
    non-inheritable, so no exec'ed process holds them). A blocking read of our own
    duplicate returns EOF exactly when that end is closed, which happens in two cases only:

    * the replica process is gone, whatever ended it (SIGKILL, OOM killer, its exit), whether or not
      the forkserver is still there;
    * the replica dropped the EngineCore's ``Process`` object, whose finalizer closes ``_parent_w``
      (garbage collection, or ``Process.close()``). vLLM keeps it in ``CoreEngineProcManager.processes``
      as long as it can still use or stop the engine; once it drops it, nothing can stop this process
      but us. multiprocessing's own list of children drops it when the forkserver dies (its status
      pipe reads EOF); that is not the last reference while vLLM holds one (a test kills the
      forkserver and collects garbage in the replica, and the EngineCore lives on).

    It cannot fire early the ways the alternatives can: ``getppid()`` and ``PR_SET_PDEATHSIG`` watch
    the forkserver, not the replica (and the forkserver outlives the replica while we hold its alive
    pipe); polling the replica's pid can hit a reused pid; ``parent_process().join()`` polls the
    sentinel, and a closed descriptor polls as ready (POLLNVAL), so we read a duplicate only we hold,
    and a read error stops the watch instead of killing. A plain ``fork()`` of the replica (without
    exec) would hold the end too and only delay the watch until that child ends.

    Then: SIGTERM to ourselves, which vLLM's handler turns into its own shutdown (it aborts the
    requests and stops its workers), and after :data:`ORPHAN_GRACE_SECONDS` SIGKILL to every process
    under us and to us, for an EngineCore stuck where SIGTERM is only recorded (construction, the
    handshake). No SIGTERM where its disposition is the default: vLLM is not yet running (nothing to
    stop gracefully) or is already stopping its workers (it resets SIGTERM first, and a SIGTERM then
    would kill it half way); the grace period covers both.
    """
    import multiprocessing

    parent = multiprocessing.parent_process()
    if parent is None or parent.sentinel is None:
        return
    sentinel = os.dup(parent.sentinel)
    threading.Thread(target=_watch, args=(sentinel,), name="raybatch-replica-watch", daemon=True).start()


def _watch(sentinel: int) -> None:
    try:
        while os.read(sentinel, 4096):  # the replica wrote nothing after the process object
            pass
    except OSError:
        log.warning("The EngineCore cannot watch its replica; only vLLM's shutdown ends it.", exc_info=True)
        return
    log.warning("The replica that started this EngineCore is gone: shutting the EngineCore down.")
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(ORPHAN_GRACE_SECONDS)
    _kill_tree()


def _kill_tree() -> None:
    """SIGKILL every process under this one, then this one."""
    with contextlib.suppress(Exception):  # psutil comes with Ray and vLLM; without it, this process only
        import psutil  # type: ignore[import-untyped]  # no stubs in the lint venv; any psutil will do

        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):  # gone already; psutil checks a reused pid itself
                child.kill()
    os.kill(os.getpid(), signal.SIGKILL)
