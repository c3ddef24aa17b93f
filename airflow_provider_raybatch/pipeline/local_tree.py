"""Listing and deleting under a local output folder without ever following a link below it.

Whoever may write a shared output folder can swap one of its folders for a link to a folder elsewhere
(``versions/<v>/outputs -> /home/ray``): a cleanup that lists through the link deletes the files it
finds there. So below the output folder every name is opened relative to its parent folder's
descriptor with ``O_NOFOLLOW``, and a link is seen as a link whatever is swapped in meanwhile:

- a link on the way to the folder asked for refuses the call (:class:`LinkInOutputError` names it);
- a link inside it is never walked: it is removed as a link (``unlink`` of the link, never of what it
  names) where a cleanup removes files, and left out of a listing.

The output folder itself is opened as named: a link above or at it is the operator's choice. Object
stores have no links; :mod:`.storage` uses this module for local paths only.
"""

from __future__ import annotations

import errno
import os
import posixpath
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class LinkInOutputError(OSError):
    """A folder on the way from the output folder to one the job cleans up is a link."""


class Entry(NamedTuple):
    """One name found under a folder: its parent folder's descriptor (open while the walk is at it)."""

    folder_fd: int
    name: str
    path: str
    is_link: bool


def _names_below(path: str, within: str) -> list[str]:
    relative = posixpath.relpath(posixpath.abspath(path), posixpath.abspath(within))
    if relative == ".":
        return []
    if relative == ".." or relative.startswith("../"):
        raise ValueError(f"{path!r} is not under the output folder {within!r}.")
    return relative.split("/")


@contextmanager
def _folder(path: str, within: str) -> Iterator[int | None]:
    """A descriptor of the folder ``path`` opened from ``within`` one name at a time without following a
    link; None when a folder on the way is missing (nothing to list or delete)."""
    try:
        fd = os.open(posixpath.abspath(within), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:  # no output yet
        yield None
        return
    try:
        walked = posixpath.abspath(within)
        for name in _names_below(path, within):
            walked = posixpath.join(walked, name)
            try:
                next_fd = os.open(name, _FOLDER_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                yield None
                return
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(fd, name):
                    raise LinkInOutputError(
                        errno.ELOOP,
                        f"{walked!r} is a link: a folder under the output folder {within!r} may not be a "
                        "link, and the job follows none there. Remove the link (the folder it names is "
                        "left as it is).",
                    ) from err
                if err.errno == errno.ENOTDIR:  # a file where a folder is expected: nothing under it
                    yield None
                    return
                raise
            os.close(fd)
            fd = next_fd
        yield fd
    finally:
        os.close(fd)


def _is_link(folder_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=folder_fd).st_mode)
    except FileNotFoundError:
        return False


def _walk(folder_fd: int, path: str) -> Iterator[Entry]:
    """Files and links under an open folder, depth first; sub-folders opened without following."""
    with os.scandir(folder_fd) as listing:
        entries = list(listing)
    for entry in entries:
        full = posixpath.join(path, entry.name)
        if entry.is_symlink():
            yield Entry(folder_fd, entry.name, full, is_link=True)
        elif entry.is_dir(follow_symlinks=False):
            try:
                sub_fd = os.open(entry.name, _FOLDER_FLAGS, dir_fd=folder_fd)
            except FileNotFoundError:
                continue  # deleted meanwhile
            except OSError as err:
                if err.errno == errno.ELOOP:  # swapped for a link since it was listed
                    yield Entry(folder_fd, entry.name, full, is_link=True)
                    continue
                raise
            try:
                yield from _walk(sub_fd, full)
            finally:
                os.close(sub_fd)
        elif entry.is_file(follow_symlinks=False):
            yield Entry(folder_fd, entry.name, full, is_link=False)


def list_files(path: str, within: str) -> list[str]:
    """Paths of the regular files under the folder ``path`` (recursively, sorted), no link followed
    or listed; empty when the folder is missing."""
    with _folder(path, within) as fd:
        if fd is None:
            return []
        return sorted(entry.path for entry in _walk(fd, posixpath.abspath(path)) if not entry.is_link)


def remove_files(path: str, within: str, keep: Callable[[str], bool]) -> int:
    """Remove each file under the folder ``path`` that ``keep`` (given its path) refuses, and every
    link there, as a link; return how many went."""
    removed = 0
    with _folder(path, within) as fd:
        if fd is None:
            return 0
        for entry in _walk(fd, posixpath.abspath(path)):
            if entry.is_link or not keep(entry.path):
                try:
                    os.unlink(entry.name, dir_fd=entry.folder_fd)
                except FileNotFoundError:
                    continue  # removed meanwhile (a retried cleanup beside this one)
                removed += 1
    return removed


def delete_tree(path: str, within: str) -> None:
    """Delete the folder ``path`` and everything under it (a link there: the link alone); a missing
    one is fine. ``shutil.rmtree`` walks by descriptors and follows no link inside."""
    with _folder(posixpath.dirname(posixpath.abspath(path)), within) as fd:
        if fd is None:
            return
        name = posixpath.basename(posixpath.abspath(path))
        try:
            mode = os.lstat(name, dir_fd=fd).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISLNK(mode):
            os.unlink(name, dir_fd=fd)
        elif stat.S_ISDIR(mode):
            shutil.rmtree(name, dir_fd=fd)


def delete_file(path: str, within: str) -> None:
    """Delete the file (or link) ``path``; a missing one is fine."""
    with _folder(posixpath.dirname(posixpath.abspath(path)), within) as fd:
        if fd is None:
            return
        name = posixpath.basename(posixpath.abspath(path))
        try:
            mode = os.lstat(name, dir_fd=fd).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(mode):
            os.unlink(name, dir_fd=fd)
