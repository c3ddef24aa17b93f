"""A batch task's parameters as written in the DAG file, checked as the DAG is parsed.

A value written as is (no template, no XCom) is what every run will see, so its mistakes fail the
DAG's import, naming the task, and its likely mistakes are warned of; a template waits for the value a
run renders (the task's start, or ``validate()``). Shared by a task built alone, a mapped task's
``partial(...)`` and each of its map indexes (operators/mapped_tasks.py).
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Mapping

from airflow_provider_raybatch.jobs import job_shipping
from airflow_provider_raybatch.operators import arguments
from airflow_provider_raybatch.operators.likely_mistakes import likely_mistakes
from airflow_provider_raybatch.operators.spec_params import (
    check_literal_params,
    rendered_flag,
    spec_from_params,
)
from airflow_provider_raybatch.shared.exceptions import BatchSpecError
from airflow_provider_raybatch.shared.json_types import ArgValue

#: Templated yes/no parameters that are not spec fields, and their defaults.
FLAGS = {"reuse_earlier_result": True}


def check_as_written(
    task: str,
    values: Mapping[str, ArgValue],
    *,
    template_fields: Collection[str],
    complete: bool,
    dag_file: str | None,
) -> frozenset[str]:
    """Raise BatchSpecError, naming ``task``, for the mistakes in the spec parameters ``values`` as
    written; return the names of those written as templates or XComs (known only when a run renders
    them).

    :param task: the task as an error names it, e.g. ``RayLLMBatchOperator (task_id: classify)``.
    :param values: spec parameters by name, and any of :data:`FLAGS`.
    :param complete: ``values`` holds every spec parameter (a task built alone); otherwise the others
        wait, as templated ones do (a ``partial(...)`` whose map indexes give them).
    :param dag_file: the task's DAG file, if known (:func:`.job_shipping.check_user_functions`).
    """
    flags = {name: values[name] for name in FLAGS if name in values}
    spec_values = {name: value for name, value in values.items() if name not in FLAGS}
    literal = {name: value for name, value in spec_values.items() if arguments.is_literal(value)}
    try:
        arguments.refuse_templates_where_none_render(
            {name: value for name, value in spec_values.items() if name not in template_fields}
        )
        _refuse_unparsable_templates(
            {name: spec_values[name] for name in template_fields if name in spec_values}
        )
        if complete and len(literal) == len(spec_values):
            spec_from_params(literal, run_key="manual")
        else:
            check_literal_params(literal)
        # Read from the modules' source, never imported here.
        job_shipping.check_user_functions(
            dag_file, preprocess=literal.get("preprocess"), postprocess=literal.get("postprocess")
        )
        for name, value in flags.items():
            if arguments.is_literal(value):
                rendered_flag(name, value, default=FLAGS[name])
    except BatchSpecError as err:  # an import error names the file: this names the task in it
        raise BatchSpecError(f"{task}: {err}") from None
    return frozenset(spec_values) - set(literal)


def _refuse_unparsable_templates(templated: Mapping[str, ArgValue]) -> None:
    """A templated parameter whose text Jinja cannot parse fails as the DAG is parsed, as it would
    fail every run (``{{ params.x }``: a closing brace short)."""
    import jinja2

    name = arguments.first_unparsable_template(dict(templated))
    if name is None:
        return
    try:
        jinja2.Environment().parse(str(templated[name]))
    except jinja2.TemplateSyntaxError as err:
        raise BatchSpecError(
            f"{name} is not a valid Jinja template: {err.message}. In a user_template only {{Column}} is "
            "ours: a doubled brace starts Jinja's {{ ... }}."
        ) from None


def warn_of_likely_mistakes(
    task: str, values: Mapping[str, ArgValue], stacklevel: int, dag_file: str | None
) -> None:
    """Warn of what :func:`.likely_mistakes.likely_mistakes` finds in ``values`` (a dict parameter's
    keys are as written even where its values are templates; a templated dict is text, not looked at).

    :param stacklevel: as for :func:`warnings.warn`, counted from the caller of this function.
    :param dag_file: the task's DAG file, if known: a preprocess module beside it is read too.
    """
    for message in likely_mistakes(values, dag_file):
        warnings.warn(f"{task}: {message}", UserWarning, stacklevel=stacklevel + 1)
