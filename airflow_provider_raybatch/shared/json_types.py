"""Names for the loosely typed values that cross the package: JSON, rows, keyword arguments.

Each is ``Any`` underneath, and the reason is written once here instead of a comment at every use: the
values come from outside (a JSON document, a user's input file, a DAG author's arguments) and are
checked where they are read, by key or by ``isinstance``. A recursive union would need a cast at each of
those reads and say no more. Shared by both sides, so it imports nothing from the package (and nothing
that is not the standard library).
"""

from __future__ import annotations

from typing import Any, TypeAlias

#: A value parsed from, or to be written as, JSON: None, bool, int, float, str, or a list or dict of them.
JsonValue: TypeAlias = Any
#: A JSON object (the manifest, a sidecar, a trigger event, an API body): text keys, JSON values.
JsonObject: TypeAlias = dict[str, JsonValue]
#: One cell of a row: whatever the input file, a preprocess, pyarrow or numpy put there.
CellValue: TypeAlias = Any
#: One row of the pipeline (read, prepared, generated or staged): column name to cell.
Row: TypeAlias = dict[str, CellValue]
#: A value given to an operator argument, a Param or a library's keyword: checked where it is used.
ArgValue: TypeAlias = Any
#: Keyword arguments passed on as they are (to vLLM, Ray, Airflow, pyarrow), whose own signatures type them.
Kwargs: TypeAlias = dict[str, ArgValue]
#: A Ray ``runtime_env`` (env_vars, py_modules, pip, ...), as Ray's job and actor APIs take it.
RuntimeEnv: TypeAlias = dict[str, ArgValue]
#: The task's or the trigger's logger: a structlog logger in a task, a ``logging.Logger`` in the triggerer;
#: we only call ``info``, ``warning`` and ``exception`` on it, which both have.
TaskLog: TypeAlias = Any
