"""Write docs/parameters.md, the reference of RayLLMBatchOperator's parameters, from the code.

Each row comes from the code: the argument's annotation and default (``__init__``), whether it is
templated (``template_fields``) and its description (a ``BatchInferenceSpec`` field's pydantic
description, else the operator docstring's ``:param:`` text). What cannot be derived is written here
as data: the groups, when each parameter is checked, and how Ray Data LLM's settings map to ours.
tests/unit/test_parameter_reference.py renders the page again and compares it with the committed one,
so a parameter added, renamed or redescribed without regenerating fails CI.

    .venvs/airflow/bin/python scripts/make_parameter_reference.py          # write the page
    .venvs/airflow/bin/python scripts/make_parameter_reference.py --check  # exit 1 if it is stale
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import textwrap
from collections.abc import Collection
from pathlib import Path

from airflow_provider_raybatch.operators.llm_batch import SPEC_PARAMETERS, RayLLMBatchOperator
from airflow_provider_raybatch.operators.ray_data_llm_settings import RAY_DATA_LLM_SETTINGS
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

PAGE = Path(__file__).resolve().parents[1] / "docs" / "parameters.md"
COMMAND = ".venvs/airflow/bin/python scripts/make_parameter_reference.py"

#: The page's groups, in order; every argument of ``__init__`` must be in exactly one.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "Input and output",
        (
            "input_uri",
            "output_uri",
            "input_format",
            "output_format",
            "openai_endpoint",
            "id_column",
            "keep_columns",
        ),
    ),
    (
        "Prompt",
        (
            "messages_column",
            "system_prompt",
            "user_template",
            "image_column",
            "image_size",
            "image_max_side",
            "image_allowed_hosts",
            "image_allowed_local_path",
            "image_allowed_s3_prefixes",
        ),
    ),
    ("Preprocess and postprocess", ("preprocess", "postprocess")),
    (
        "Sampling and engine",
        (
            "model",
            "sampling_params",
            "engine_kwargs",
            "batch_size",
            "max_concurrent_batches",
            "model_cache_dir",
            "compile_cache_dir",
        ),
    ),
    (
        "Layout and resources",
        (
            "concurrency",
            "accelerator_type",
            "replica_resources",
            "check_layout",
            "entrypoint_resources",
            "runtime_env",
        ),
    ),
    (
        "Failures and reruns",
        (
            "max_failed_fraction",
            "max_failed_rows",
            "keep_versions",
            "reuse_earlier_result",
            "dry_run",
            "dry_run_rows_per_second",
        ),
    ),
    ("Warm engines", ("keep_warm_seconds",)),
    (
        "Connections and Airflow behaviour",
        (
            "ray_conn_id",
            "aws_conn_id",
            "deferrable",
            "poll_interval_seconds",
            "progress_interval_seconds",
            "input_asset",
            "output_asset",
        ),
    ),
)

#: The checks of a pre/postprocess dotted path after the spec's (jobs/job_shipping.py,
#: shared/user_functions.py).
_USER_FUNCTION_CHECKS = (
    "Its function too, then and by `validate()`, read from its module's source (never imported): where the "
    "module is found (on `sys.path`, else beside the DAG file: a DAG's own test that parses the DAGs "
    "folder with `DagBag` finds it too), it must define the function at its top level (a def, a class, "
    "an assignment or an import of that name), else the error gives the likely name; a module not found "
    "there fails as misspelled where one of a close name lies beside the DAG file or in the DAGs folder "
    "(`did you mean 'review_prep'?`), and is otherwise left to the job, as is one that "
    "binds names as it runs (`from x import *`, `globals()`). Then, when the task "
    "submits the job: its module must import where the task runs (it is shipped with the job); the job's "
    "driver imports the function before any row is read."
)
#: Checks of spec fields that come after the spec's own, read from the code that makes them.
LATER_CHECKS: dict[str, str] = {
    "model": "Then the job's driver, before any engine starts: a local model folder must exist and hold "
    "`config.json`; an `s3://` model fetched with `aws_conn_id`'s settings must have files under its prefix. "
    "A Hugging Face id is left to vLLM.",
    "input_uri": "Then the job's driver, before any engine starts: it must name at least one input file, "
    "none too large to read whole.",
    "preprocess": _USER_FUNCTION_CHECKS,
    "postprocess": _USER_FUNCTION_CHECKS,
    "engine_kwargs": "Then, with `check_layout`, when the task submits: the tensor x pipeline parallel "
    "replicas must fit the cluster's alive nodes. The job's driver, before any replica starts: each key "
    "must be an engine argument of the cluster's vLLM.",
    "concurrency": "Then, with `check_layout`, when the task submits: the replicas must fit the cluster's "
    "alive nodes.",
    "accelerator_type": "Then, with `check_layout`, when the task submits: the replicas must fit the "
    "cluster's alive nodes of that type.",
    "replica_resources": "Then, with `check_layout`, when the task submits: the replicas must fit the "
    "cluster's alive nodes.",
    "model_cache_dir": "Then, when the job fetches an `s3://` model with `aws_conn_id`'s settings: `~` "
    "expanded by the driver must give an absolute path, and each node refuses the folder if another user "
    "owns it or can write it or a folder above it.",
}

#: When the operator-only arguments are checked, and by what, read from the code that uses them.
OPERATOR_CHECKS: dict[str, str] = {
    "reuse_earlier_result": "Written as is: at DAG parse. Templated: by `task.validate(context)`, and "
    "when the task runs, before it looks for an earlier try's job. `True`/`False`, or text "
    "`true`/`false`, `1`/`0`, `yes`/`no`; unset or empty is the default; anything else is refused.",
    "ray_conn_id": "When the task first calls the cluster, before it submits (it lists the cluster's jobs "
    "for an earlier try's): the connection must exist and its settings must parse. The triggerer reads it "
    "again when deferred. Not at DAG parse.",
    "aws_conn_id": "When the task submits a job, and only if `model`, `input_uri` or `output_uri` is on "
    "`s3://`: the Amazon provider must be installed, and the connection's credentials are resolved then. "
    "The task also reads the job's committed result at `output_uri` with it. Not by "
    "`task.validate(context)`.",
    "check_layout": "Not checked: a true value turns the check on. The check runs when the task submits a "
    "job, before anything is uploaded: the planned replicas (`concurrency`, tensor and pipeline parallel "
    "sizes, `replica_resources`, `accelerator_type`) must fit the cluster's alive nodes, else "
    "`ClusterLayoutError`; off, the plan is only logged.",
    "runtime_env": "When the task submits a job, before anything is uploaded: the pipeline's `RAYBATCH_*` "
    "settings in `env_vars` must be text holding a whole number in range, else `BatchSpecError`; the job "
    "checks them again as it starts. The rest is Ray's: its Jobs API refuses a runtime_env that is not a "
    "dict with text keys, and Ray sets up the environment (e.g. `pip`) as the job starts.",
    "entrypoint_resources": "Not checked by the operator: Ray's Jobs API refuses, at submission, anything "
    "but a dict of resource names to numbers. A resource no alive node offers leaves the job pending until "
    "Ray fails it (`RAY_JOB_START_TIMEOUT_SECONDS`, 15 minutes by default).",
    "deferrable": "Not checked: a true value defers once the job is submitted or found. The default is "
    "read from Airflow's `[operators] default_deferrable` when the operator's module is imported.",
    "poll_interval_seconds": "When the task is built (DAG parse): a value that is not > 0 is refused "
    "(`ValueError`), before any job is submitted, deferrable or not.",
    "progress_interval_seconds": "Not range-checked: 0 or less turns the lines off. A value that is not a "
    "number fails when the wait begins (the trigger converts it with `float()`, the worker compares it "
    "with 0).",
    "input_asset": "At DAG parse: a URI given as text becomes an Airflow `Asset`, which refuses an empty "
    "or over-long URI and the reserved `airflow` scheme.",
    "output_asset": "At DAG parse: a URI given as text becomes an Airflow `Asset`, which refuses an empty "
    "or over-long URI and the reserved `airflow` scheme. A dry run emits no event on it.",
}


def ray_setting_names() -> set[str]:
    """Every name the mapping table covers (a row may name several)."""
    return {name.strip() for setting in RAY_DATA_LLM_SETTINGS for name in setting.name.split(",")}


# -- reading the code ---------------------------------------------------------------------------------


def init_parameters() -> dict[str, inspect.Parameter]:
    """``__init__``'s own arguments, in order (not ``self`` nor BaseOperator's ``**kwargs``)."""
    parameters = inspect.signature(RayLLMBatchOperator.__init__).parameters
    return {name: p for name, p in parameters.items() if name != "self" and p.kind is not p.VAR_KEYWORD}


def default_expressions() -> dict[str, ast.expr]:
    """Each default of ``__init__`` as written: a default computed by a call (Airflow's configuration,
    read at import) is shown as its expression, since its value depends on where the page is made."""
    source = textwrap.dedent(inspect.getsource(RayLLMBatchOperator.__init__))
    function = ast.parse(source).body[0]
    assert isinstance(function, ast.FunctionDef)
    arguments = function.args
    pairs = zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True)
    return {arg.arg: node for arg, node in pairs if node is not None}


def docstring_params(doc: str) -> dict[str, str]:
    """The ``:param name: text`` entries of a docstring, each as one line."""
    params: dict[str, str] = {}
    name = None
    for line in inspect.cleandoc(doc).splitlines():
        if match := re.match(r":param (\w+):\s*(.*)", line):
            name = match[1]
            params[name] = match[2]
        elif name is not None and line.startswith(" ") and line.strip():
            params[name] += " " + line.strip()
        else:
            name = None
    return params


def type_text(annotation: str, templated: bool) -> str:
    """The Type cell: the annotation in words; for a templated parameter whose annotation admits text
    beside its own type (``list[str] | str | None``), that text is a template rendering the value,
    not the value written as text (``keep_columns="a,b"`` is refused: it is not a list)."""
    words = plain_type(annotation)
    if not templated or words.startswith("str"):
        return words
    own = words.replace(", str or None", " or None").replace(" or str", "").replace(", str", "")
    as_json = " (as JSON: `| tojson`)" if "list" in own or "dict" in own or "(" in own else ""
    return f"{own}; or a template rendering one{as_json}"


def plain_type(annotation: str) -> str:
    """An annotation in words: ``dict[str, Any] | str | None`` -> ``dict of str to any, str or None``."""
    return _plain(ast.parse(annotation, mode="eval").body)


def _plain(node: ast.expr) -> str:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        members = [_plain(member) for member in _union_members(node)]
        return ", ".join(members[:-1]) + " or " + members[-1]
    if isinstance(node, ast.Subscript):
        outer = ast.unparse(node.value)
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        inner = [_plain(item) for item in items]
        if outer == "list":
            return f"list of {inner[0]}"
        if outer == "tuple":
            return "(" + ", ".join(inner) + ")"
        if outer == "dict":
            return f"dict of {inner[0]} to {inner[1]}"
    text = ast.unparse(node)
    if text in _ALIASES:
        return _plain(_ALIASES[text])
    return "any" if text == "Any" else text


def _type_aliases() -> dict[str, ast.expr]:
    """The package's named types (json_types.py: ``Kwargs = dict[str, ArgValue]``, ``ArgValue = Any``),
    so a parameter annotated with one reads as the type it stands for."""
    tree = ast.parse(
        (
            Path(__file__).resolve().parents[1] / "airflow_provider_raybatch" / "shared" / "json_types.py"
        ).read_text()
    )
    return {
        node.target.id: node.value
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None
    }


_ALIASES = _type_aliases()


def _union_members(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return [*_union_members(node.left), *_union_members(node.right)]
    return [node]


# -- writing the page ---------------------------------------------------------------------------------


def markdown(text: str) -> str:
    """Docstring or description text as one Markdown table cell."""
    text = re.sub(
        r":(?:class|mod|func|meth|data|attr):`(~?)([^`]+)`",
        lambda match: f"`{match[2].rsplit('.', 1)[-1] if match[1] else match[2]}`",
        " ".join(text.split()),
    ).replace("``", "`")
    # '<run_key>' outside code would be read as an HTML tag and vanish: escape it there only.
    pieces = text.split("`")
    pieces[::2] = [piece.replace("<", "&lt;") for piece in pieces[::2]]
    return "`".join(pieces).replace("|", "\\|")


def default_text(parameter: inspect.Parameter, expression: ast.expr | None) -> str:
    if parameter.default is inspect.Parameter.empty:
        return "required"
    if isinstance(expression, ast.Call):
        return f"`{ast.unparse(expression)}`"
    return f"`{parameter.default!r}`"


def checked_text(name: str, templated: bool) -> str:
    """When a parameter is checked: a spec field by the spec (then :data:`LATER_CHECKS`), else by hand."""
    if name not in SPEC_PARAMETERS:
        return OPERATOR_CHECKS[name]
    if templated:
        text = "Written as is: at DAG parse. Templated: when the task runs, or by `task.validate(context)`."
    else:
        text = "At DAG parse (not templated)."
    return f"{text} {LATER_CHECKS[name]}" if name in LATER_CHECKS else text


def description(name: str, params: dict[str, str]) -> str:
    if name in SPEC_PARAMETERS:
        return BatchInferenceSpec.model_fields[name].description or ""
    return params[name]


def check_coverage(parameters: Collection[str], params: Collection[str]) -> None:
    """Fail, naming them, for arguments in no group or in two, and operator-only ones with no check text
    or no ``:param:`` text (``params``)."""
    grouped = [name for _, names in GROUPS for name in names]
    problems = [f"{name}: in no group of GROUPS" for name in parameters if name not in grouped]
    problems += [f"{name}: in GROUPS but not an argument" for name in grouped if name not in parameters]
    problems += [f"{name}: in two groups" for name in sorted(set(grouped)) if grouped.count(name) > 1]
    problems += [
        f"{name}: not a spec field and not in OPERATOR_CHECKS"
        for name in parameters
        if name not in SPEC_PARAMETERS and name not in OPERATOR_CHECKS
    ]
    problems += [
        f"{name}: not a spec field and no :param: text in RayLLMBatchOperator's docstring"
        for name in parameters
        if name not in SPEC_PARAMETERS and name not in params
    ]
    if problems:
        raise ValueError("make_parameter_reference: " + "; ".join(problems))


INTRO = """\
Every argument of `RayLLMBatchOperator` (`airflow_provider_raybatch/operators/llm_batch.py`) besides
BaseOperator's own (`task_id`, `retries`, `execution_timeout`, ...).

**When a parameter is checked.** The batch parameters are the fields of `BatchInferenceSpec`
(`airflow_provider_raybatch/specs.py`); the operator builds that spec as the DAG is parsed. A value
written as is (no Jinja, no XCom) is checked then, so a mistake is an import error of the DAG, not a
failed task. So are the checks across parameters (e.g. `image_size` needs `image_column`) whose
parameters are all written as is; a check that involves a templated parameter waits for the
rendered values: when the task runs, before anything is submitted, or earlier, in a DAG's own test,
by `task.validate(context)`, which renders the templates with `context` and builds the spec. A
template given to a parameter that is not templated is refused as the DAG is parsed, and so is a
template Jinja cannot parse (`{{ params.day }`: a brace short). A mapped
task (`.partial(...).expand(...)` or `.expand_kwargs(...)`) is checked as the DAG is parsed too:
`partial`'s values written as is, and each map index whose values the DAG file lists (an error names
the map index); a value mapped over an upstream task's XCom waits, as a template does, and
`RayLLMBatchOperator.validate_mapped(task, context, expand=...)` validates every map index in a DAG's
own test. Some legal values that are most likely mistakes are warned of (a Python `UserWarning`,
shown with the DAG's other warnings) as the DAG is parsed and by `validate()`: a key of
`engine_kwargs` one letter off a common vLLM engine argument, a resource name of
`replica_resources` or `entrypoint_resources` that differs from Ray's `CPU`, `GPU` or `memory` only
in case or a letter, a `runtime_env` field one letter off Ray's, and a `preprocess` whose source
returns `messages` or `prompt` beside `user_template` or `messages_column`, which the job uses
instead. The spec's `run_key` is not a
parameter: the operator derives it from the DAG, run, task and map index. Templated dict, list and
number parameters may render to JSON text: render a dict or list Param with `| tojson`
(`"{{ params.engine_kwargs | tojson }}"`), as Jinja's own rendering of one is Python text, not JSON.
A templated parameter that renders to empty text, `None` or `null` (an unset Param, or a Param whose
value is None) takes its default, as if the argument were left out; a required one (`model`,
`input_uri`, `output_uri`) is refused. Written as is, an empty text is refused as the value it is.
"""

RAY_INTRO = """\
The job's driver builds Ray Data LLM's processor, `build_processor(vLLMEngineProcessorConfig(...),
preprocess=..., postprocess=...)` (`pipeline/run.py`, `pipeline/generate/processor.py`), then puts
the pipeline's own chat-template and engine stages in Ray's. Each setting of Ray Data LLM (Ray 2.57
to 2.60, and older names) and what sets it here:
"""


def render() -> str:
    """The whole page."""
    parameters = init_parameters()
    params = docstring_params(RayLLMBatchOperator.__doc__ or "")
    check_coverage(parameters, params)
    defaults = default_expressions()
    templated = set(RayLLMBatchOperator.template_fields)
    lines = [
        f"_Generated from the code by `{COMMAND}`; edit the code, not this page._",
        "",
        "# RayLLMBatchOperator parameters",
        "",
        INTRO,
    ]
    for title, names in GROUPS:
        lines += [
            f"## {title}",
            "",
            "| Parameter | Type | Default | Templated | Checked | Description |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for name in names:
            parameter = parameters[name]
            cells = (
                f"`{name}`",
                markdown(type_text(str(parameter.annotation), name in templated)),
                default_text(parameter, defaults.get(name)).replace("|", "\\|"),
                "yes" if name in templated else "no",
                markdown(checked_text(name, name in templated)),
                markdown(description(name, params)),
            )
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines += [
        "## From Ray Data LLM to this operator",
        "",
        RAY_INTRO,
        "| Ray Data LLM | In | This operator |",
        "| --- | --- | --- |",
    ]
    for setting in RAY_DATA_LLM_SETTINGS:
        names = ", ".join(f"`{name.strip()}`" for name in setting.name.split(","))
        lines.append(f"| {names} | {setting.where} | {markdown(setting.ours)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    page = render()
    if argv == ["--check"]:
        if PAGE.read_text(encoding="utf-8") != page:
            print(f"{PAGE} is out of date: run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
