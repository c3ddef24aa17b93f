"""A pre/postprocess dotted path's function, looked for in its module's source without importing it:
refused only where the source is plainly there and plainly binds no such name."""

from __future__ import annotations

import py_compile
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_raybatch.shared.user_functions import keys_set_by, missing_function, split_dotted_path

PREFIX = "raybatch_uf_"


@pytest.fixture
def code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path for the test's modules (named ``raybatch_uf_*``), none imported after."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith(PREFIX)]:
        del sys.modules[name]


def write(folder: Path, relative: str, source: str) -> Path:
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


@pytest.mark.parametrize(
    ("dotted_path", "parts"),
    [
        ("rows.clean", ("rows", "clean")),
        ("pkg.sub.rows.clean", ("pkg.sub.rows", "clean")),
        ("pkg.sub.rows:clean", ("pkg.sub.rows", "clean")),
    ],
)
def test_a_dotted_path_splits_into_module_and_function(dotted_path: str, parts: tuple[str, str]) -> None:
    assert split_dotted_path(dotted_path) == parts


BINDINGS = {
    "a def": "def fn(row):\n    return row\n",
    "an async def": "async def fn(row):\n    return row\n",
    "a class": "class fn:\n    def __call__(self, row):\n        return row\n",
    "an assignment": "def _impl(row):\n    return row\nfn = _impl\n",
    "an annotated assignment": "from typing import Any\nfn: Any = print\n",
    "an unpacking": "other, (fn, *rest) = print, (print, 1)\n",
    "an import": "from json import loads as fn\n",
    "an import of the name": "from os.path import join, fn\n",
    "a module import": "import fn\n",
    "a dotted module import": "import fn.sub\n",
    "an if block": "import os\nif os.name:\n    def fn(row):\n        return row\nelse:\n    fn = None\n",
    "a try block": "try:\n    from fast import fn\nexcept ImportError:\n    def fn(row):\n        pass\n",
    "a with block": "import contextlib\nwith contextlib.suppress(Exception):\n    fn = print\n",
    "a for loop": "for fn in (print,):\n    pass\n",
    "a walrus": "if (fn := print):\n    pass\n",
    "a global statement": "def _setup():\n    global fn\n    fn = print\n_setup()\n",
    "a decorated def": "import functools\n@functools.cache\ndef fn(row):\n    return row\n",
}


@pytest.mark.parametrize("source", BINDINGS.values(), ids=BINDINGS.keys())
def test_a_name_bound_at_the_top_level_in_any_way_is_found(code: Path, source: str) -> None:
    write(code, f"{PREFIX}bound.py", source)

    assert missing_function(f"{PREFIX}bound.fn") is None
    assert missing_function(f"{PREFIX}bound:fn") is None


def test_a_misspelled_function_is_named_with_the_likely_spelling_and_the_file(code: Path) -> None:
    path = write(code, f"{PREFIX}rows.py", "import json\n\ndef clean_company(row):\n    return row\n")

    assert missing_function(f"{PREFIX}rows.clean_compnay") == (
        f"module '{PREFIX}rows' ({path}) defines no 'clean_compnay' at its top level "
        "(did you mean 'clean_company'?)."
    )


def test_a_name_like_none_lists_the_modules_functions(code: Path) -> None:
    path = write(
        code, f"{PREFIX}rows.py", "def clean(row):\n    return row\n\ndef _private(row):\n    pass\n"
    )

    assert missing_function(f"{PREFIX}rows:zzzzzz") == (
        f"module '{PREFIX}rows' ({path}) defines no 'zzzzzz' at its top level (its functions: clean)."
    )


def test_names_bound_only_inside_functions_or_classes_are_not_the_modules(code: Path) -> None:
    write(
        code,
        f"{PREFIX}scoped.py",
        """
        def outer():
            def fn(row):
                return row
            fn2 = fn
            return fn2

        class Holder:
            fn = print

            def method(self):
                setattr(self, "fn", print)  # an instance's attribute, not the module's
                return vars(self)
        """,
    )

    assert "defines no 'fn'" in (missing_function(f"{PREFIX}scoped.fn") or "")


DYNAMIC = {
    "a star import": "from json import *\n",
    "a star import in a try": "try:\n    from fast import *\nexcept ImportError:\n    pass\n",
    "globals()": "globals()['fn'] = print\n",
    "globals() in a function": "def _register(name):\n    globals()[name] = print\n_register('fn')\n",
    "globals().update": "globals().update({'fn': print})\n",
    "sys.modules": "import sys\nsys.modules[__name__].fn = print\n",
    "setattr at the top": "import sys\nsetattr(sys.modules[__name__], 'fn', print)\n",
    "exec at the top": "exec('def fn(row): return row')\n",
    "vars() at the top": "vars()['fn'] = print\n",
    "a module __getattr__": "def __getattr__(name):\n    return print\n",
}


@pytest.mark.parametrize("source", DYNAMIC.values(), ids=DYNAMIC.keys())
def test_a_module_that_binds_names_at_run_time_is_taken_on_trust(code: Path, source: str) -> None:
    write(code, f"{PREFIX}dynamic.py", source)

    assert missing_function(f"{PREFIX}dynamic.fn") is None


def test_a_module_is_never_run_nor_its_packages(code: Path) -> None:
    marker = code / "ran"
    run = f"open({str(marker)!r}, 'w').write('ran')\nraise SystemExit('imported')\n"
    write(code, f"{PREFIX}heavy/__init__.py", run)
    write(code, f"{PREFIX}heavy/rows.py", run + "def clean(row):\n    return row\n")
    write(code, f"{PREFIX}heavy_single.py", run + "def clean(row):\n    return row\n")

    assert missing_function(f"{PREFIX}heavy.rows.clean") is None
    assert "defines no 'claen'" in (missing_function(f"{PREFIX}heavy.rows.claen") or "")
    assert "defines no 'claen'" in (missing_function(f"{PREFIX}heavy_single:claen") or "")
    assert not marker.exists()
    assert not [name for name in sys.modules if name.startswith(PREFIX)]


def test_a_function_of_a_package_module_and_of_a_package(code: Path) -> None:
    write(code, f"{PREFIX}pkg/__init__.py", "from .helpers import shared\n\ndef top(row):\n    return row\n")
    write(code, f"{PREFIX}pkg/helpers.py", "def shared(row):\n    return row\n")
    post = write(code, f"{PREFIX}pkg/sub/post.py", "def tidy(row):\n    return row\n")
    write(code, f"{PREFIX}pkg/sub/__init__.py", "")

    for found in ("pkg.sub.post.tidy", "pkg.sub.post:tidy", "pkg:top", "pkg.top", "pkg.shared"):
        assert missing_function(PREFIX + found) is None, found
    assert missing_function(f"{PREFIX}pkg.sub.post.tidyy") == (
        f"module '{PREFIX}pkg.sub.post' ({post}) defines no 'tidyy' at its top level (did you mean 'tidy'?)."
    )
    assert missing_function(f"{PREFIX}pkg.sub.post") == (
        f"'post' is a module of module '{PREFIX}pkg.sub' ({post.parent / '__init__.py'}), not a function in "
        f"it: name its function, e.g. '{PREFIX}pkg.sub.post.tidy'."
    )


def test_a_name_a_parent_package_sets_on_its_module_is_taken_on_trust(code: Path) -> None:
    write(code, f"{PREFIX}patched/__init__.py", "from . import rows\nrows.fn = print\n")
    write(code, f"{PREFIX}patched/rows.py", "def other(row):\n    return row\n")

    assert missing_function(f"{PREFIX}patched.rows.fn") is None
    assert missing_function(f"{PREFIX}patched.rows.gone") is not None


def test_a_namespace_package_module_is_checked(code: Path) -> None:
    write(code, f"{PREFIX}ns/rows.py", "def clean(row):\n    return row\n")

    assert missing_function(f"{PREFIX}ns.rows.clean") is None
    assert "did you mean 'clean'?" in (missing_function(f"{PREFIX}ns.rows.claen") or "")


@pytest.mark.parametrize(
    "dotted_path",
    [
        f"{PREFIX}absent.fn",  # not on this path: maybe on the cluster's
        f"{PREFIX}absent.sub.fn",
        f"{PREFIX}pkg.absent.fn",  # a package's module that is not there
        f"{PREFIX}single.sub.fn",  # a module used as a package
        f"{PREFIX}ns",  # a namespace package's own name: no source
        "not a path",
        "",
        "x.",
        ".fn",
    ],
)
def test_a_module_not_found_or_a_path_that_is_none_is_not_judged(code: Path, dotted_path: str) -> None:
    write(code, f"{PREFIX}pkg/__init__.py", "")
    write(code, f"{PREFIX}single.py", "def fn(row):\n    return row\n")
    write(code, f"{PREFIX}ns/rows.py", "")

    assert missing_function(dotted_path) is None


def test_a_module_without_source_or_that_does_not_parse_is_taken_on_trust(code: Path) -> None:
    source = write(code, f"{PREFIX}compiled.py", "def other(row):\n    return row\n")
    py_compile.compile(str(source), cfile=str(code / f"{PREFIX}compiled.pyc"))
    source.unlink()  # byte code only
    write(code, f"{PREFIX}broken.py", "def fn(row:\n")
    write(code, f"{PREFIX}latin.py", "# -*- coding: latin-1 -*-\nNAME = 'caf\xe9'\n")

    assert missing_function(f"{PREFIX}compiled.fn") is None
    assert missing_function(f"{PREFIX}broken.fn") is None
    assert "defines no 'fn'" in (missing_function(f"{PREFIX}latin.fn") or "")


def test_a_module_already_imported_is_read_from_its_file(code: Path) -> None:
    path = write(code, f"{PREFIX}loaded.py", "def clean(row):\n    return row\n")
    __import__(f"{PREFIX}loaded")

    assert missing_function(f"{PREFIX}loaded.clean") is None
    path.write_text("def renamed(row):\n    return row\n")  # edited since: the file is what ships
    assert "defines no 'clean'" in (missing_function(f"{PREFIX}loaded.clean") or "")


def test_a_module_beside_the_dag_file_is_found_where_sys_path_lacks_it(tmp_path: Path) -> None:
    """A DAG's own test parses its DAGs folder without putting it on sys.path, as Airflow does."""
    dags = tmp_path / "dags"
    rows = write(dags, f"{PREFIX}beside.py", "def clean(row):\n    return {'messages': []}\n")
    write(dags, f"{PREFIX}beside_pkg/__init__.py", "")
    post = write(dags, f"{PREFIX}beside_pkg/post.py", "def tidy(row):\n    return row\n")
    dag_file = str(dags / "my_dag.py")
    assert str(dags) not in sys.path

    assert missing_function(f"{PREFIX}beside.claen") is None  # not found: taken on trust
    assert missing_function(f"{PREFIX}beside.claen", dag_file) == (
        f"module '{PREFIX}beside' ({rows}) defines no 'claen' at its top level (did you mean 'clean'?)."
    )
    assert missing_function(f"{PREFIX}beside_pkg.post.tidyy", dag_file) == (
        f"module '{PREFIX}beside_pkg.post' ({post}) defines no 'tidyy' at its top level "
        "(did you mean 'tidy'?)."
    )
    assert missing_function(f"{PREFIX}beside.clean", dag_file) is None
    assert missing_function(f"{PREFIX}beside_pkg.post:tidy", dag_file) is None
    assert keys_set_by(f"{PREFIX}beside.clean", dag_file) == {"messages"}
    assert not [name for name in sys.modules if name.startswith(PREFIX)]


def test_a_module_on_sys_path_comes_before_one_beside_the_dag_file(code: Path, tmp_path: Path) -> None:
    """The module the job ships is the one ``import`` finds: sys.path's, as Airflow's own import."""
    write(code, f"{PREFIX}twice.py", "def clean(row):\n    return row\n")
    dags = tmp_path / "dags"
    write(dags, f"{PREFIX}twice.py", "def other(row):\n    return row\n")

    assert missing_function(f"{PREFIX}twice.clean", str(dags / "my_dag.py")) is None


def test_a_misspelled_module_beside_the_dag_file_names_the_likely_one(tmp_path: Path) -> None:
    """Found neither on sys.path nor beside the DAG file, with a close name there: the likely one."""
    dags = tmp_path / "dags"
    write(dags, f"{PREFIX}review_prep.py", "def prepare_review(row):\n    return row\n")
    dag_file = str(dags / "my_dag.py")

    assert missing_function(f"{PREFIX}reviewprep.prepare_review", dag_file) == (
        f"no module '{PREFIX}reviewprep' is on sys.path or beside the DAG file ({dags}); "
        f"did you mean '{PREFIX}review_prep'?"
    )
    assert missing_function(f"{PREFIX}reviewprep.prepare_review") is None  # no DAG file: on trust
    assert missing_function(f"{PREFIX}nothing_like_it.prepare", dag_file) is None  # on trust
    assert missing_function(f"{PREFIX}review_prep.prepare_review", dag_file) is None
    assert not [name for name in sys.modules if name.startswith(PREFIX)]


def test_a_misspelled_module_in_the_dags_folder_of_a_dag_in_a_subfolder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DAG in a subfolder names a module of the DAGs folder, which Airflow puts on sys.path."""
    dags = tmp_path / "dags"
    write(dags, f"{PREFIX}review_prep.py", "def prepare_review(row):\n    return row\n")
    dag_file = str(dags / "team" / "my_dag.py")
    monkeypatch.syspath_prepend(str(dags))

    assert missing_function(f"{PREFIX}reviewprep.prepare_review", dag_file) == (
        f"no module '{PREFIX}reviewprep' is on sys.path or beside the DAG file ({dags / 'team'}); "
        f"did you mean '{PREFIX}review_prep'?"
    )
