"""An EngineCore that dies after its engine was built writes its error nowhere, and never through a
link another local user planted where the build's error folder was (pipeline/generate/engine.py).

A warm pool's EngineCores live for hours; the build's private folder is gone by then, and its name
(in /tmp, visible to every local user) can be made again by anyone, with a link at the error file's
name to any file the Ray user can write."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from airflow_provider_raybatch.pipeline.generate import engine

#: How many error-file names the planted folder covers: the build numbers its EngineCores' files.
PLANTED_NAMES = 1000


def _die_when_told(started: str, go: str) -> None:  # runs in the forked EngineCore
    Path(started).touch()
    deadline = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.05)
    raise ValueError("an EngineCore dying hours after its build")


def test_an_engine_core_dying_after_its_build_writes_through_no_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("the Ray user's file")
    started, go = tmp_path / "started", tmp_path / "go"
    with engine.engine_core_errors():
        folder = Path(engine._build_error_folder or "")
        process = engine._forkserver_context().Process(target=_die_when_told, args=(str(started), str(go)))
        process.start()
        deadline = time.monotonic() + 60
        while not started.exists():
            assert time.monotonic() < deadline and process.exitcode is None, "the EngineCore did not start"
            time.sleep(0.05)
    # The build is over and its folder gone; another local user makes it again, a link at every name.
    assert not folder.exists()
    folder.mkdir()
    try:
        for number in range(PLANTED_NAMES):
            (folder / f"{number:06d}.error").symlink_to(victim)
        go.touch()
        process.join(60)
        assert process.exitcode == 1
        assert victim.read_text() == "the Ray user's file"
        assert all(path.is_symlink() for path in folder.iterdir())  # nothing written beside them
    finally:
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()


def test_an_engine_core_starting_after_its_build_uses_no_folder_another_user_made_at_the_name(
    tmp_path: Path,
) -> None:
    """An EngineCore that opens the error folder only after the build ended may find another local user's
    folder at the name (a plain one this time, no link): it is not mkdtemp's, so nothing is written."""
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    if os.geteuid() == 0:  # root can give it away; otherwise the mode alone tells it from mkdtemp's
        os.chown(theirs, 65534, 65534)
    else:
        theirs.chmod(0o777)
    ours = Path(tempfile.mkdtemp(dir=tmp_path))

    refused = engine._open_error_folder(str(theirs / "000000.error"))
    opened = engine._open_error_folder(str(ours / "000000.error"))

    assert refused is None
    assert opened is not None
    os.close(opened)
