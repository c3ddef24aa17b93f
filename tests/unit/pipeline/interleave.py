"""Run calls of the pipeline side by side in one process, one storage call at a time, in a chosen order.

Two jobs that publish at the same moment run the same code on two machines; what they can do to each
other is decided by the order of their storage calls (a read of ``manifest.json``, a write, a
deletion). :func:`interleave` runs each call in its own thread and lets exactly one of them make its
next storage call, in the order ``choose`` picks among those waiting: every interleaving of their
storage calls can be drawn (by hypothesis), and the same choices give the same run. The calls are the
pipeline's own; storage is the real local disk.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from airflow_provider_raybatch.pipeline import storage

#: The storage functions a call waits its turn at (a call they make themselves does not wait again).
GATED = (
    "exists",
    "read_bytes",
    "read_text",
    "write_bytes",
    "write_text",
    "delete_file",
    "delete_tree",
    "list_files",
)
#: A call that neither reaches its next storage call nor ends in this long is stuck: the test fails.
STEP_TIMEOUT_SECONDS = 30.0


def interleave(
    calls: dict[str, Callable[[], Any]], choose: Callable[[list[str]], str]
) -> dict[str, Any]:  # Any: what each call returns.
    """Run ``calls`` side by side; return what each returned (an exception each raised is raised here).

    :param choose: given the names of the calls waiting at a storage call (sorted), the one to go next.
    """
    turn = threading.Condition()
    waiting: dict[str, threading.Event] = {}
    finished: set[str] = set()
    names: dict[int, str] = {}
    nested = threading.local()
    results: dict[str, Any] = {}  # Any: what each call returns
    errors: dict[str, BaseException] = {}

    def gate(function: Callable[..., Any]) -> Callable[..., Any]:
        def gated(*args: Any, **kwargs: Any) -> Any:  # Any: the storage function's own arguments
            name = names.get(threading.get_ident())
            if name is None or getattr(nested, "inside", False):
                return function(*args, **kwargs)
            go = threading.Event()
            with turn:
                waiting[name] = go
                turn.notify_all()
            go.wait()
            nested.inside = True
            try:
                return function(*args, **kwargs)
            finally:
                nested.inside = False

        return gated

    def run(name: str, call: Callable[[], Any]) -> None:
        names[threading.get_ident()] = name
        try:
            results[name] = call()
        except BaseException as err:  # noqa: BLE001 - handed to the test's thread
            errors[name] = err
        finally:
            with turn:
                finished.add(name)
                turn.notify_all()

    originals = {function: getattr(storage, function) for function in GATED}
    for function, original in originals.items():
        setattr(storage, function, gate(original))
    threads = [threading.Thread(target=run, args=item, daemon=True) for item in calls.items()]
    try:
        for thread in threads:
            thread.start()
        while True:
            with turn:
                parked = turn.wait_for(
                    lambda: len(waiting) + len(finished) == len(calls), STEP_TIMEOUT_SECONDS
                )
                if not parked:
                    raise TimeoutError(f"stuck: waiting {sorted(waiting)}, finished {sorted(finished)}")
                if not waiting:
                    break
                go = waiting.pop(choose(sorted(waiting)))
            go.set()
    finally:
        for function, original in originals.items():
            setattr(storage, function, original)
        with turn:  # after a failure here, let the calls still waiting run out
            for go in waiting.values():
                go.set()
        for thread in threads:
            thread.join(STEP_TIMEOUT_SECONDS)
    for err in errors.values():
        raise err
    return results
