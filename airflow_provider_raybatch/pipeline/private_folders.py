"""Folders on a node that only the Ray user can write: where we keep what vLLM loads and runs.

The model cache (:mod:`.generate.model_cache`) and the compile cache
(:mod:`.generate.engine_caches`) hold files that vLLM, torch and Triton load and
run: a model's code with ``trust_remote_code``, compiled graphs, kernels. On a node other local users
share, a folder one of them made first (or a link, or a folder they can write) would have the replica
run their code, or hand them ours. So:

* Every folder from the root down is the Ray user's and nobody else can write it: a link, another
  owner, or group or other write permission is refused, naming the path. Missing ones are made 0700,
  and one others may read (0755) is made 0700.
* The folders above the root are the Ray user's or root's, and others may write one only where the
  sticky bit keeps them from renaming what is not theirs (``/tmp``); they are checked as named and as
  their links resolve.

Nothing below the checked folders is walked: what is made inside them later is as private as the
process's umask makes it, and a root of 0700 (as made here) keeps all of it the Ray user's alone.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import stat

#: Write bits of a folder's group and others.
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


class PrivateFolderError(RuntimeError):
    """A folder another local user could have made, or could write, where vLLM would load what it holds."""


def make_private_folders(root: str, folder: str, setting: str) -> None:
    """Make ``root`` and each folder from it down to ``folder`` where missing (0700), and check them and
    the folders above ``root``.

    :param setting: what the folder is and where its path came from, as the refusal quotes it first:
        ``"model_cache_dir='/mnt/models'"``, ``"the Triton cache (TRITON_CACHE_DIR, set in ...)"``.
    :raises PrivateFolderError: naming the first folder another local user could have made or could write.
    """
    root = posixpath.abspath(root)
    folder = posixpath.abspath(folder)
    if folder != root and not folder.startswith(root.rstrip("/") + "/"):
        raise ValueError(f"{folder!r} is not under {root!r} ({setting}).")
    _check_above(posixpath.dirname(root), setting)
    steps = [step for step in folder[len(root) :].split("/") if step]
    path = root
    for step in [None, *steps]:
        path = path if step is None else posixpath.join(path, step)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        check_private(path, setting)
        if stat.S_IMODE(os.lstat(path).st_mode) & 0o077:
            # Ours (checked), made readable by an older provider or by vLLM or Triton themselves
            # (0755): what they write in it is as readable as their umask leaves it, compiled code and
            # fetched weights to every local user.
            os.chmod(path, 0o700)


def check_private(path: str, setting: str) -> None:
    """Refuse a folder that is a link, not ours, or writable by its group or others.

    :param setting: as in :func:`make_private_folders`.
    """
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        _refuse(path, "is a symbolic link", setting)
    if not stat.S_ISDIR(info.st_mode):
        _refuse(path, "is not a folder", setting)
    if info.st_uid != os.geteuid():
        _refuse(path, f"is owned by uid {info.st_uid}", setting)
    if info.st_mode & _OTHERS_WRITE:
        _refuse(path, f"is writable by its group or others (mode {oct(stat.S_IMODE(info.st_mode))})", setting)


def _check_above(path: str, setting: str) -> None:
    """The folders above the root, as named and as the links resolve: each is ours or root's, and one
    others may write has the sticky bit (they cannot rename what is not theirs in it). Missing ones are
    made 0700."""
    for chain in (_prefixes(path), _prefixes(os.path.realpath(path))):
        for prefix in chain:
            try:
                info = os.lstat(prefix)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):  # made meanwhile by a concurrent replica or fetch
                    os.mkdir(prefix, 0o700)
                info = os.lstat(prefix)
            owners = (os.geteuid(), 0)
            if info.st_uid not in owners:
                _refuse(prefix, f"(a folder above it) is owned by uid {info.st_uid}", setting)
            if stat.S_ISLNK(info.st_mode):
                continue  # the link's owner is checked; its target is in the resolved chain
            if info.st_mode & _OTHERS_WRITE and not info.st_mode & stat.S_ISVTX:
                _refuse(
                    prefix,
                    "(a folder above it) is writable by its group or others without the sticky "
                    f"bit (mode {oct(stat.S_IMODE(info.st_mode))})",
                    setting,
                )


def _prefixes(path: str) -> list[str]:
    """``/``, ``/a``, ``/a/b`` ... of an absolute path."""
    steps = [step for step in posixpath.abspath(path).split("/") if step]
    return ["/"] + ["/" + "/".join(steps[: index + 1]) for index in range(len(steps))]


def _refuse(path: str, problem: str, setting: str) -> None:
    raise PrivateFolderError(
        f"{setting}: {path!r} {problem}, so another local user could have put files there that vLLM "
        "would load and run, or could change or read what the job keeps there. Set it to a folder that "
        f"only the Ray user (uid {os.geteuid()}) owns and can write (a missing one is made, 0700), or "
        "delete this one and let the next run make it again: a chown or chmod would keep whatever another "
        "user may have put inside."
    )
