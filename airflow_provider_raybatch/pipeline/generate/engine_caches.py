"""The folders a replica's engine loads compiled code from: each named to the engine by the replica,
and checked to be the Ray user's alone before the engine starts (and again at each attach of a warm
pool's replica, :mod:`.pool_replica`).

Three caches hold code that the replica loads and runs: vLLM's (``VLLM_CACHE_ROOT``: its torch.compile
graphs), Triton's (``TRITON_CACHE_DIR``: kernels) and torch Inductor's (``TORCHINDUCTOR_CACHE_DIR``:
generated code, used when vLLM's own compile cache is off). On a node other local users share, one of
them could make such a folder first (or a link at its name, or a folder above it they can write) and
plant code there. Every one of them is therefore named explicitly, so that the engine uses exactly the
folder that was checked:

* ``compile_cache_dir`` set: vLLM's cache root is it, Triton's and Inductor's are folders under it.
* unset: vLLM's cache root as vLLM would find it (``VLLM_CACHE_ROOT``, else ``$XDG_CACHE_HOME/vllm``,
  else ``~/.cache/vllm``); Triton's the ``TRITON_CACHE_DIR`` the replica's environment sets, else
  Triton's own default ``~/.triton/cache`` (made explicit: torch's Inductor moves an unset one into
  its own folder, and the next run's kernels would be looked for elsewhere, :mod:`.engine`).
* Inductor's is always a folder under vLLM's cache root: torch fills the variable itself with its
  default, ``<tempdir>/torchinductor_<user>`` (``/tmp``, which every local user can write), the
  moment anything asks for it (importing vLLM does), so a value already set cannot be told from that
  default, and is replaced.

A value from the environment (the node's or the job's ``runtime_env``) is checked as the job's own
setting is, and a refusal names the cache, where its path came from and the folder (:class:`CacheFolder`).

One more folder is not a cache the variables move: Inductor precompiles the C++ headers of CPU
kernels into ``<tempdir>/torchinductor_<user>/precompiled_headers`` whatever its cache variable says
(``default_cache_dir()``), and compiles a header it finds there into every kernel. The replica turns
that off (:data:`PRECOMPILED_HEADERS_VARIABLE`): each kernel compiles its headers itself, once, as its
``.so`` is cached in the checked folder.
"""

from __future__ import annotations

import os
import posixpath
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from airflow_provider_raybatch.pipeline import private_folders

#: How a refusal names a path that came from the replica's environment.
_FROM_ENVIRONMENT = "set in the replica's environment: the node's or the job's runtime_env"
#: Inductor's folder under vLLM's cache root (or ``compile_cache_dir``).
INDUCTOR_FOLDER = "inductor"
#: Triton's folder under ``compile_cache_dir``.
TRITON_FOLDER = "triton"
#: torch Inductor's switch for the CPU kernels' precompiled headers, kept in /tmp (module docstring).
PRECOMPILED_HEADERS_VARIABLE = "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"


@dataclass(frozen=True)
class CacheFolder:
    """One folder the engine loads compiled code from, as the replica names it to the engine and checks it.

    :param variable: the environment variable the replica sets to ``path`` before its engine starts.
    :param path: the folder, absolute once expanded (a relative one or one with a ``..`` step is refused).
    :param root: the folder from which down to ``path`` every folder must be the Ray user's alone (the
        folders above it: the Ray user's or root's, sticky where others can write).
    :param what: the cache, for a refusal: ``"the Triton cache"``.
    :param source: where ``path`` came from, for a refusal: ``"TRITON_CACHE_DIR, set in ..."``.
    """

    variable: str
    path: str
    root: str
    what: str
    source: str

    @property
    def setting(self) -> str:
        """What a refusal names first: the cache and where its path came from."""
        return f"{self.what} ({self.source})"


def cache_folders(cache_dir: str | None, environ: Mapping[str, str]) -> tuple[CacheFolder, ...]:
    """The folders a replica names to its engine, vLLM's cache root first (the others may be under it).

    :param cache_dir: the spec's ``compile_cache_dir``; None: the replica's environment and the
        libraries' defaults (the module doc).
    :param environ: the replica's environment before it sets anything.
    """
    if cache_dir:
        root = os.path.expanduser(cache_dir)
        given = f"compile_cache_dir={cache_dir!r}"
        return (
            CacheFolder("VLLM_CACHE_ROOT", root, root, "vLLM's cache root", f"VLLM_CACHE_ROOT, from {given}"),
            CacheFolder(
                "TRITON_CACHE_DIR",
                posixpath.join(root, TRITON_FOLDER),
                root,
                "the Triton cache",
                f"TRITON_CACHE_DIR, under {given}",
            ),
            _inductor_under(root, f"under {given}"),
        )
    vllm_root = _vllm_cache_root(environ)
    if triton := environ.get("TRITON_CACHE_DIR"):  # as Triton reads it: no ~ expanded
        triton_folder = CacheFolder(
            "TRITON_CACHE_DIR", triton, triton, "the Triton cache", f"TRITON_CACHE_DIR, {_FROM_ENVIRONMENT}"
        )
    else:
        default = os.path.expanduser(posixpath.join("~", ".triton", "cache"))
        source = "Triton's default ~/.triton/cache, compile_cache_dir being unset"
        triton_folder = CacheFolder("TRITON_CACHE_DIR", default, default, "the Triton cache", source)
    return (vllm_root, triton_folder, _inductor_under(vllm_root.path, "under vLLM's cache root"))


def _vllm_cache_root(environ: Mapping[str, str]) -> CacheFolder:
    """vLLM's cache root as vLLM finds it (``vllm/envs.py``), an empty variable counting as unset."""
    if root := environ.get("VLLM_CACHE_ROOT"):
        path, source = os.path.expanduser(root), f"VLLM_CACHE_ROOT, {_FROM_ENVIRONMENT}"
    elif xdg := environ.get("XDG_CACHE_HOME"):
        path = os.path.expanduser(posixpath.join(xdg, "vllm"))
        source = f"vLLM's default $XDG_CACHE_HOME/vllm, XDG_CACHE_HOME {_FROM_ENVIRONMENT}"
    else:
        path = os.path.expanduser(posixpath.join("~", ".cache", "vllm"))
        source = "vLLM's default ~/.cache/vllm, compile_cache_dir being unset"
    return CacheFolder("VLLM_CACHE_ROOT", path, path, "vLLM's cache root", source)


def _inductor_under(root: str, where: str) -> CacheFolder:
    source = f"TORCHINDUCTOR_CACHE_DIR, which the replica sets {where}"
    return CacheFolder(
        "TORCHINDUCTOR_CACHE_DIR",
        posixpath.join(root, INDUCTOR_FOLDER),
        root,
        "torch Inductor's cache",
        source,
    )


def check(folders: Iterable[CacheFolder]) -> None:
    """Make each folder where missing (0700) and check it, and every folder from its root down, to be
    the Ray user's alone (:func:`..private_folders.make_private_folders`).

    :raises PrivateFolderError: naming the cache, where its path came from, the folder and what is
        wrong with it.
    """
    for folder in folders:
        # The check walks the path as written; the kernel resolves a '..' after the links before it.
        if not posixpath.isabs(folder.path) or ".." in folder.path.split("/"):
            raise private_folders.PrivateFolderError(
                f"{folder.setting}: {folder.path!r} must be an absolute path with no '..' step: vLLM, "
                "Triton and torch run what that folder holds, and it is checked as its path names it."
            )
        private_folders.make_private_folders(folder.root, folder.path, folder.setting)


def checked_cache_folders(cache_dir: str | None, environ: Mapping[str, str]) -> tuple[CacheFolder, ...]:
    """:func:`cache_folders`, once :func:`check` passed them; in the replica, before its engine starts."""
    folders = cache_folders(cache_dir, environ)
    check(folders)
    return folders


def environment(folders: Iterable[CacheFolder]) -> dict[str, str]:
    """The variables that name ``folders`` to vLLM, Triton and torch."""
    return {folder.variable: folder.path for folder in folders}


def turn_off_precompiled_headers() -> None:
    """Keep torch's precompiled headers out of ``/tmp``: off in this process's environment (an EngineCore
    spawned reads it) and in a torch it imported already (whose config read the variable then; an
    EngineCore forked from this process inherits that)."""
    os.environ[PRECOMPILED_HEADERS_VARIABLE] = "0"
    config = sys.modules.get("torch._inductor.config")
    if config is not None:
        config.cpp_cache_precompile_headers = False  # type: ignore[attr-defined]
        config.aot_inductor.precompile_headers = False
