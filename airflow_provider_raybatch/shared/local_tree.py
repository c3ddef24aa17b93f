"""Listing, deleting and writing under a local output folder without ever following a link below it.

Whoever may write a shared output folder can swap one of its folders for a link to a folder elsewhere
(``versions/<v>/outputs -> /home/ray``): a cleanup that lists through the link deletes the files it
finds there. So below the output folder every name is opened relative to its parent folder's
descriptor with ``O_NOFOLLOW``, and a link is seen as a link whatever is swapped in meanwhile:

- a link on the way to the folder asked for refuses the call (:class:`LinkInOutputError` names it);
- a link inside it is never walked: it is removed as a link (``unlink`` of the link, never of what it
  names) where a cleanup removes files, and left out of a listing;
- a file written there is made under a new name in its folder's descriptor and renamed over its name
  in that folder (a link at the name is replaced, never written through); missing folders on the way
  are made in their parent's descriptor.

The output folder itself is opened as named: a link above or at it is the operator's choice. Object
stores have no links: the cluster side's storage (``pipeline/storage.py``) and the Batch API store's
reads of a run's output (``openai_api/run_output.py``) use this module for local paths only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import shutil
import stat
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class LinkBelowError(OSError):
    """A name on the way from a folder to a path under it is a link (:attr:`link`: its path)."""

    def __init__(self, link: str) -> None:
        super().__init__(errno.ELOOP, f"{link!r} is a link")
        self.link = link


class LinkInOutputError(LinkBelowError):
    """A folder on the way from the output folder to one the job cleans up is a link."""

    def __init__(self, link: str, within: str) -> None:
        super().__init__(link)
        self.strerror = (
            f"{link!r} is a link: a folder under the output folder {within!r} may not be a link, and the "
            "job follows none there. Remove the link (the folder it names is left as it is)."
        )


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
        raise ValueError(f"{path!r} is not under the folder {within!r}.")
    return relative.split("/")


def _step(folder_fd: int, name: str, flags: int, walked: str) -> int:
    """Open ``name`` in an open folder without following a link; LinkBelowError when it is one."""
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder_fd)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(folder_fd, name):
            raise LinkBelowError(walked) from err
        raise


def _open_folder(path: str, within: str, make: bool = False) -> int:
    """A descriptor of the folder ``path``, opened from ``within`` (as named) one name at a time;
    ``make``: each missing folder (``within`` too) is made first, in its parent's descriptor."""
    if make:
        os.makedirs(posixpath.abspath(within), exist_ok=True)
    fd = os.open(posixpath.abspath(within), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    walked = posixpath.abspath(within)
    try:
        for name in _names_below(path, within):
            walked = posixpath.join(walked, name)
            if make:
                with contextlib.suppress(FileExistsError):  # a link there too: _step refuses it
                    os.mkdir(name, dir_fd=fd)
            next_fd = _step(fd, name, os.O_RDONLY | os.O_DIRECTORY, walked)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file(path: str, within: str) -> int:
    """A descriptor of the regular file ``path`` opened for reading from the folder ``within`` (as
    named) one name at a time, following no link below ``within``.

    :raises LinkBelowError: the file or a folder on the way is a link.
    :raises OSError: it is missing, or no regular file (a FIFO, a device: ``EINVAL``).
    """
    folder_fd = _open_folder(posixpath.dirname(posixpath.abspath(path)), within)
    try:
        fd = _step(folder_fd, posixpath.basename(path), os.O_RDONLY | os.O_NONBLOCK, posixpath.abspath(path))
    finally:
        os.close(folder_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{path!r} is not a regular file")
    return fd


@contextmanager
def _folder(path: str, within: str) -> Iterator[int | None]:
    """A descriptor of the folder ``path`` under the output folder ``within`` (:func:`_open_folder`);
    None when it or a folder on the way is missing (nothing to list or delete)."""
    try:
        fd = _open_folder(path, within)
    except LinkBelowError as err:
        raise LinkInOutputError(err.link, within) from err
    except (FileNotFoundError, NotADirectoryError):
        yield None
        return
    try:
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


class _Named(NamedTuple):
    """A name under the output folder, as :func:`_named` found it."""

    folder_fd: int  # its folder's descriptor
    name: str  # its name in that folder
    mode: int  # its lstat mode: a link is a link


@contextmanager
def _named(path: str, within: str) -> Iterator[_Named | None]:
    """``path`` under the output folder ``within``, its folder opened without following a link on the
    way; None when it or a folder on the way is missing."""
    name = posixpath.basename(posixpath.abspath(path))
    with _folder(posixpath.dirname(posixpath.abspath(path)), within) as fd:
        try:
            mode = None if fd is None else os.lstat(name, dir_fd=fd).st_mode
        except FileNotFoundError:
            mode = None
        yield None if fd is None or mode is None else _Named(fd, name, mode)


def delete_tree(path: str, within: str) -> None:
    """Delete the folder ``path`` and everything under it (a link there: the link alone); a missing
    one is fine. ``shutil.rmtree`` walks by descriptors and follows no link inside."""
    with _named(path, within) as found:
        if found is not None and stat.S_ISLNK(found.mode):
            os.unlink(found.name, dir_fd=found.folder_fd)
        elif found is not None and stat.S_ISDIR(found.mode):
            shutil.rmtree(found.name, dir_fd=found.folder_fd)


def delete_file(path: str, within: str) -> None:
    """Delete the file (or link) ``path``; a missing one is fine."""
    with _named(path, within) as found:
        if found is not None and not stat.S_ISDIR(found.mode):
            os.unlink(found.name, dir_fd=found.folder_fd)


def _output_folder(path: str, within: str) -> int:
    """:func:`_open_folder` with ``make``, a link on the way refused as :class:`LinkInOutputError`."""
    try:
        return _open_folder(path, within, make=True)
    except LinkBelowError as err:
        raise LinkInOutputError(err.link, within) from err


def make_folders(path: str, within: str) -> None:
    """Make the folder ``path`` under the output folder ``within`` and those on the way, following no
    link below ``within``.

    :raises LinkInOutputError: a folder on the way (or ``path``) is a link.
    """
    os.close(_output_folder(path, within))


def exists(path: str, within: str) -> bool:
    """Whether ``path`` under the output folder ``within`` is there (a link at it counts: reading it
    refuses), its folders opened without following a link.

    :raises LinkInOutputError: a folder on the way is a link.
    """
    with _named(path, within) as found:
        return found is not None


def read_file(path: str, within: str, check_size: Callable[[int], None] | None = None) -> bytes:
    """The bytes of the regular file ``path`` under the output folder ``within``, following no link
    below ``within`` (:func:`open_file`); ``check_size`` is given its size first, and may refuse it
    (raise) before a byte is read.

    :raises LinkInOutputError: the file or a folder on the way is a link.
    :raises FileNotFoundError: it or a folder on the way is missing.
    """
    try:
        fd = open_file(path, within)
    except LinkBelowError as err:
        raise LinkInOutputError(err.link, within) from err
    with os.fdopen(fd, "rb") as file:
        if check_size is not None:
            check_size(os.fstat(fd).st_size)
        return file.read()


def write_file(path: str, within: str, data: bytes) -> None:
    """Write the file ``path`` under the output folder ``within`` so that readers see the old or the
    new content, never a torn one, following no link below ``within``: its folders are opened (made
    where missing) one name at a time, and the file is made under a new name with ``O_EXCL`` in its
    folder's descriptor and renamed over ``path`` there (a link at ``path`` is replaced as a link).

    :raises LinkInOutputError: a folder on the way is a link.
    """
    name = posixpath.basename(posixpath.abspath(path))
    folder_fd = _output_folder(posixpath.dirname(posixpath.abspath(path)), within)
    try:
        temporary = f"{name}.tmp-{uuid.uuid4().hex[:8]}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temporary, flags, 0o666, dir_fd=folder_fd)  # less the umask, as before
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
            os.rename(temporary, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary, dir_fd=folder_fd)
            raise
    finally:
        os.close(folder_fd)
