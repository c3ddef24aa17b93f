"""Turn the operator's rendered parameters into the job spec, and its templated flags into bools.

Airflow renders templated fields to text, so a dict, list, tuple or number given as
``"{{ params.engine_kwargs | tojson }}"`` arrives as a string. This module reads such text back
into the value the spec expects before :class:`BatchInferenceSpec` validates it; the spec itself
stays free of template concerns. Kept apart from the operator so that its lifecycle does not mix
with text parsing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection

from airflow_provider_raybatch.shared.exceptions import BatchSpecError
from airflow_provider_raybatch.shared.json_types import Kwargs
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

#: The operator's parameters that are the job spec's fields (all but the run key, which a run gives).
SPEC_PARAMETERS = tuple(name for name in BatchInferenceSpec.model_fields if name != "run_key")
# Spec fields that take a dict, list or number; after templating they may arrive as (JSON) text.
_JSON_PARAMS = tuple(
    """
    sampling_params engine_kwargs replica_resources keep_columns concurrency image_size image_max_side
    image_allowed_hosts image_allowed_s3_prefixes max_failed_fraction max_failed_rows keep_warm_seconds
    """.split()
)
#: What an unset Param renders to through a template: the parameter's default, as if left out.
_UNSET_TEXT = ("", "null", "None")
_TUPLE_TEXT = re.compile(r"^\(\s*\d+\s*,\s*\d+\s*\)$")  # "(1, 4)", as a tuple renders


def spec_from_params(params: Kwargs, run_key: str, templated: Collection[str] = ()) -> BatchInferenceSpec:
    """The validated job spec from the (rendered) parameters; raises BatchSpecError naming the field.

    :param params: the operator's values of the spec's fields (all but ``run_key``); not modified.
    :param run_key: the logical run's identity (:meth:`TaskTry.run_key`); retries share it.
    :param templated: the parameters written as templates: one that rendered to empty text, ``None``
        or ``null`` (an unset Param) takes its default; written so, it is refused as the value it is.
    """
    return BatchInferenceSpec.build(**{**_parsed(params, templated), "run_key": run_key})


def check_literal_params(params: Kwargs) -> None:
    """Raise BatchSpecError for the mistakes of these parameters' own values, each checked alone: what
    a DAG can check as it is parsed while its other parameters are templated.

    :param params: some of the operator's values of the spec's fields; not modified.
    """
    BatchInferenceSpec.check_fields(_parsed(params))


def _tojson_hint(name: str, text: str) -> str:
    """Where ``text`` reads as Python's text of a dict or list (what ``{{ params.x }}`` renders), how
    to render it as JSON instead."""
    if "'" in text or re.search(r"\b(True|False|None)\b", text):
        return (
            f" It looks like Python's text of a value, which Jinja renders from a dict or list: render "
            f"it as JSON with '| tojson', e.g. '{{{{ params.{name} | tojson }}}}'."
        )
    return ""


def _parsed(params: Kwargs, templated: Collection[str] = ()) -> Kwargs:
    """``params`` with JSON text read back into values, and unset text left out (the spec's default)."""
    params = {**params}
    if "output_format" in params and not params["output_format"]:
        del params["output_format"]  # the spec's default: parquet, or jsonl for an OpenAI batch file
    for name, value in list(params.items()):
        if name in _JSON_PARAMS or name not in templated or not isinstance(value, str):
            continue
        if value.strip() not in _UNSET_TEXT:
            continue
        spec_field = BatchInferenceSpec.model_fields.get(name)
        if spec_field is not None and spec_field.is_required():
            raise BatchSpecError(
                f"{name}={value!r}: a required parameter rendered empty (a Param left unset, or set to "
                "None?); give it a value."
            )
        del params[name]  # an unset Param rendered through a template: the spec's default
    for name in _JSON_PARAMS:
        if name not in params:
            continue
        value = params[name]
        if not isinstance(value, str):
            continue
        text = value.strip()
        if text in _UNSET_TEXT:
            del params[name]  # an unset Param rendered through a template: the spec's default
        elif name in ("concurrency", "image_size") and _TUPLE_TEXT.match(text):
            params[name] = tuple(int(part) for part in re.findall(r"\d+", text))
        elif name in ("concurrency", "image_max_side") and text.isdigit():
            params[name] = int(text)
        elif text[:1] in ("{", "["):
            try:
                params[name] = json.loads(text)
            except json.JSONDecodeError as err:
                raise BatchSpecError(
                    f"{name}={value!r} is text but not valid JSON: {err.msg}.{_tojson_hint(name, text)}"
                ) from err
    if isinstance(params.get("concurrency"), list):
        params["concurrency"] = tuple(params["concurrency"])
    return params


def rendered_flag(name: str, value: bool | str | None, default: bool) -> bool:
    """A templated yes/no parameter's value: a bool as given, or the text a template rendered it to
    (``"{{ params.reuse }}"`` renders a bool as ``True`` or ``False``); unset (None, or an unset Param
    rendered as empty, ``None`` or ``null``) is ``default``, as for the spec's parameters."""
    if isinstance(value, bool):
        return value
    text = "" if value is None else str(value).strip().lower()
    if text in ("", "none", "null"):
        return default
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise BatchSpecError(f"{name}={value!r} is neither true nor false (True/False, true/false, 1/0, yes/no).")
