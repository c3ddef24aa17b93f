"""A DAG author's pre/postprocess function named by its dotted path: where its module is, and whether
that module defines it, read from the source without running it.

The job imports the function on the cluster; a misspelled name used to pass every check on the
Airflow side and fail the job. The module may import heavy libraries (torch, a tokenizer), so it is
never imported here: its file is found as the import system would find it, and its source is parsed.
Only a module whose source is plainly there and plainly binds no such name is refused, and a module
found nowhere here while one of a close name lies beside the DAG file or in the DAGs folder
(``reviewprep`` beside ``review_prep.py``: the task could not ship it either). A module not found
here and like none of those (it may be on the cluster's path only), one without a Python source file,
or one that binds names at run time (``from x import *``, ``globals()``, a module ``__getattr__``) is
taken on trust.

A module is looked for on ``sys.path``, then beside the DAG file. Airflow puts the DAGs folder on
``sys.path`` as it parses and runs DAGs, but a DAG's own test (``DagBag(dag_folder="dags/")``, then
``validate()``) does not: there, a module beside the DAG file or a package in the DAGs folder was not
found, and a misspelled function in it passed the test to fail the job.
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.machinery
import importlib.util
import pkgutil
import sys
from collections.abc import Iterator
from pathlib import Path

#: Calls that bind module names no parse can see when made at the module's top level (``exec(code)``,
#: ``setattr(module, ...)``, ``vars()[name] = ...``); inside a function they bind the function's own.
_DYNAMIC_AT_TOP = frozenset({"vars", "locals", "exec", "eval", "setattr"})
#: A source larger than this is not parsed (no DAG author's row functions are that long).
_MAX_SOURCE_BYTES = 2 * 1024 * 1024


def split_dotted_path(dotted_path: str) -> tuple[str, str]:
    """``("pkg.module", "function")`` from ``pkg.module:function`` or ``pkg.module.function``."""
    module_name, sep, attribute = dotted_path.partition(":")
    if not sep:
        module_name, _, attribute = dotted_path.rpartition(".")
    return module_name, attribute


def missing_function(dotted_path: str, dag_file: str | None = None) -> str | None:
    """Why ``dotted_path``'s module plainly lacks its function, or is likely misspelled, with the likely
    names; None when it defines it or when that cannot be told without running the module (see the
    module docstring).

    :param dag_file: the DAG file that names the function, if known: its folder is looked in for the
        module when ``sys.path`` does not have it.
    """
    module_name, attribute = split_dotted_path(dotted_path)
    parts = module_name.split(".")
    if not attribute.isidentifier() or not all(part.isidentifier() for part in parts):
        return None  # not a dotted path: the spec's own check says so
    specs = _module_specs(parts, dag_file)
    if specs is None:
        return _misspelled_module(parts[0], dag_file)
    source = _source_file(specs[-1])
    if source is None:
        return None
    names = _bound_names(source)
    if names is None or attribute in names:
        return None
    # A parent package runs first and may set the name on its submodule (mod.fn = ..., setattr).
    for parent in specs[:-1]:
        if parent.origin is None:
            continue  # a namespace package: no code of its own
        parent_source = _source_file(parent)
        if parent_source is None or _assigns_attribute(parent_source, attribute):
            return None
    where = f"module {module_name!r} ({source})"
    submodule = _submodule(specs[-1], attribute)
    if submodule is not None:
        functions = _functions(submodule)
        example = f"'{module_name}.{attribute}.{functions[0] if functions else 'my_function'}'"
        return (
            f"{attribute!r} is a module of {where}, not a function in it: name its function, e.g. {example}."
        )
    close = difflib.get_close_matches(attribute, sorted(names), n=3)
    if close:
        hint = f" (did you mean {' or '.join(repr(name) for name in close)}?)"
    else:
        functions = sorted(_functions(source))
        hint = f" (its functions: {', '.join(functions[:8])}{', ...' if len(functions) > 8 else ''})"
        hint = hint if functions else ""
    return f"{where} defines no {attribute!r} at its top level{hint}."


def likely_module(name: str, folders: list[str] | None = None) -> str | None:
    """The top-level module in ``folders`` (default: all of ``sys.path``) whose name is closest to a
    misspelled ``name``, if one is close (``review_prep`` for ``reviewprep``)."""
    names = {module.name for module in pkgutil.iter_modules(folders)}
    close = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.8)
    return close[0] if close else None


def _misspelled_module(name: str, dag_file: str | None) -> str | None:
    """Why top-level module ``name``, found neither on ``sys.path`` nor beside the DAG file, is likely
    misspelled: a module of a close name beside the DAG file or in the DAGs folder; None otherwise
    (found after all, or nothing close: it may be on the cluster's path only, taken on trust)."""
    if not dag_file:
        return None
    beside = Path(dag_file).resolve().parent
    try:
        if importlib.util.find_spec(name) or importlib.machinery.PathFinder.find_spec(name, [str(beside)]):
            return None  # found: the None came from a submodule, which the import reports
    except (ImportError, ValueError):
        return None
    # The DAGs folder is on sys.path where Airflow parses: the entries the DAG file lies under.
    dags_folders = [entry for entry in sys.path if entry and beside.is_relative_to(Path(entry).resolve())]
    folders = [str(beside), *dict.fromkeys(dags_folders)]
    likely = likely_module(name, folders)
    if likely is None:
        return None
    return f"no module {name!r} is on sys.path or beside the DAG file ({beside}); did you mean {likely!r}?"


def _module_specs(parts: list[str], dag_file: str | None) -> list[importlib.machinery.ModuleSpec] | None:
    """The specs of ``a``, ``a.b``, ... found without importing any of them, or None where one is not
    found. (``importlib.util.find_spec('a.b')`` would import, so run, package ``a``.) ``a`` is looked
    for on ``sys.path``, then in ``dag_file``'s folder."""
    specs: list[importlib.machinery.ModuleSpec] = []
    for index in range(len(parts)):
        name = ".".join(parts[: index + 1])
        spec: importlib.machinery.ModuleSpec | None
        try:
            if index == 0 or name in sys.modules:
                # A top-level name, or one imported already: runs nothing.
                spec = importlib.util.find_spec(name)
                if spec is None and index == 0 and dag_file:
                    beside = str(Path(dag_file).resolve().parent)
                    spec = importlib.machinery.PathFinder.find_spec(name, [beside])
            else:
                parent = sys.modules.get(specs[-1].name)
                locations = getattr(parent, "__path__", None) or specs[-1].submodule_search_locations
                if locations is None:
                    return None  # a module, not a package: the import says so
                spec = importlib.machinery.PathFinder.find_spec(name, list(locations))
        except (ImportError, ValueError):  # a module in sys.modules without a spec, say
            return None
        if spec is None:
            return None
        specs.append(spec)
    return specs


def _source_file(spec: importlib.machinery.ModuleSpec) -> Path | None:
    """The ``.py`` file a spec loads, or None (an extension module, byte code only, a namespace)."""
    origin = Path(spec.origin) if spec.has_location and spec.origin else None
    return origin if origin is not None and origin.suffix == ".py" and origin.is_file() else None


def _submodule(spec: importlib.machinery.ModuleSpec, name: str) -> Path | None:
    """The source file of the submodule ``name`` of package ``spec``, if it is one."""
    if spec.submodule_search_locations is None:
        return None
    found = importlib.machinery.PathFinder.find_spec(
        f"{spec.name}.{name}", list(spec.submodule_search_locations)
    )
    return _source_file(found) if found is not None else None


def _parsed(path: Path) -> ast.Module | None:
    stat = path.stat()
    return _parsed_version(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _parsed_version(path: str, mtime_ns: int, size: int) -> ast.Module | None:
    """One version of a source file, parsed: a DAG is parsed again and again, its modules rarely change."""
    if size > _MAX_SOURCE_BYTES:
        return None
    try:
        return ast.parse(importlib.util.decode_source(Path(path).read_bytes()), filename=path)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None  # the import on the cluster reports it, in that Python's words


def _module_scope(tree: ast.Module) -> Iterator[ast.AST]:
    """The nodes a module runs at its top level, into if/try/with/for blocks: a function or class
    statement itself, not its body."""
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            pending.extend(ast.iter_child_nodes(node))


def _is_dynamic(tree: ast.Module) -> bool:
    """Whether the module may bind names no parse can see: a star import, ``globals()``,
    ``sys.modules``, a module ``__getattr__``, or ``exec`` / ``setattr`` / ``vars`` at its top level."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(alias.name == "*" for alias in node.names):
            return True
        if isinstance(node, ast.Name) and node.id == "globals":
            return True
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "modules"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        ):
            return True  # sys.modules[__name__].fn = ...
    return any(
        (isinstance(node, ast.Name) and node.id in _DYNAMIC_AT_TOP)
        or (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "__getattr__")
        for node in _module_scope(tree)
    )


def _bound_names(path: Path) -> frozenset[str] | None:
    """The names a module binds at its top level, or None when its source cannot tell."""
    tree = _parsed(path)
    if tree is None or _is_dynamic(tree):
        return None
    # A function may bind a module name when it is called (``global fn``): taken as bound.
    names = {name for node in ast.walk(tree) if isinstance(node, ast.Global) for name in node.names}
    for node in _module_scope(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
    return frozenset(names)


def _functions(path: Path) -> list[str]:
    """The public functions a module defines at its top level, in order."""
    tree = _parsed(path)
    if tree is None:
        return []
    defined = (node for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef))
    return [node.name for node in defined if not node.name.startswith("_")]


def _assigns_attribute(path: Path, attribute: str) -> bool:
    """Whether a module may set ``attribute`` on another module (``mod.fn = ...``), or its source
    cannot tell."""
    tree = _parsed(path)
    if tree is None or _is_dynamic(tree):
        return True
    return any(
        isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr == attribute
        for node in ast.walk(tree)
    )


def keys_set_by(dotted_path: str, dag_file: str | None = None) -> frozenset[str] | None:
    """The text keys a row function plainly puts in a dict it builds (``{"messages": ...}``,
    ``dict(prompt=...)``, ``row["messages"] = ...``, ``row.update(prompt=...)``), read from its
    module's source; None where the function's source is not found here (see :func:`missing_function`).

    A key written only in a comprehension or under another name is not seen: what this finds is
    certain to be set on some path, not every key the function may set.

    :param dag_file: as for :func:`missing_function`.
    """
    module_name, attribute = split_dotted_path(dotted_path)
    parts = module_name.split(".")
    if not attribute.isidentifier() or not all(part.isidentifier() for part in parts):
        return None
    specs = _module_specs(parts, dag_file)
    source = _source_file(specs[-1]) if specs else None
    tree = _parsed(source) if source is not None else None
    if tree is None:
        return None
    defined = (node for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef))
    function = next((node for node in defined if node.name == attribute), None)
    if function is None:
        return None
    keys: set[object] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Dict):
            keys.update(key.value for key in node.keys if isinstance(key, ast.Constant))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            if isinstance(node.slice, ast.Constant):
                keys.add(node.slice.value)
        elif isinstance(node, ast.Call) and _builds_a_dict(node.func):
            keys.update(keyword.arg for keyword in node.keywords if keyword.arg is not None)
    return frozenset(key for key in keys if isinstance(key, str))


def _builds_a_dict(func: ast.expr) -> bool:
    """``dict(...)`` or ``<something>.update(...)``: calls whose keyword arguments become keys."""
    return (isinstance(func, ast.Name) and func.id == "dict") or (
        isinstance(func, ast.Attribute) and func.attr == "update"
    )
