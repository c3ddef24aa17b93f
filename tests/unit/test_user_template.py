"""The one rule of ``user_template``, end to end: Airflow's Jinja, then ``{Column}`` from each row.

Rendered through the operator's real ``render_template_fields`` (Airflow's own Jinja environment,
``StrictUndefined`` and all), validated by the spec, filled by the pipeline's ``build_messages``: a
prompt may hold any literal brace, a JSON example above all.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from airflow.sdk import DAG
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator
from airflow_provider_raybatch.pipeline.prompt.prompts import build_messages
from airflow_provider_raybatch.shared.exceptions import BatchSpecError
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec, parse_user_template, template_fields

REQUIRED = {"model": "m", "input_uri": "s3://b/in/data.jsonl", "output_uri": "s3://b/out/"}


def rendered_operator(user_template: str, **context: Any) -> RayLLMBatchOperator:  # Any: context values.
    """An operator of a DAG (so Airflow's Jinja environment), its fields rendered as a task run does."""
    with DAG("prompt_rules", schedule=None):
        operator = RayLLMBatchOperator(task_id="classify", user_template=user_template, **REQUIRED)
    operator.render_template_fields({"ds": "2026-11-20", "params": {}, **context})
    return operator


def test_a_json_example_with_row_fields_and_a_jinja_value_gives_the_exact_prompt() -> None:
    template = (
        "On {{ ds }}, classify {Company} (customer {Customer Id}, {{ params.region }}).\n"
        'Answer as {"label": "...", "scores": {"Law Firm": 0.9, "Other": 0.1}}, or {} when unsure.'
    )
    operator = rendered_operator(template, params={"region": "EMEA"})

    spec = operator.build_spec()
    messages = build_messages(spec, {"Company": "Acme {Legal}", "Customer Id": "007"})

    assert messages == [
        {
            "role": "user",
            "content": "On 2026-11-20, classify Acme {Legal} (customer 007, EMEA).\n"
            'Answer as {"label": "...", "scores": {"Law Firm": 0.9, "Other": 0.1}}, or {} when unsure.',
        }
    ]


def test_a_jinja_rendered_json_value_stays_literal() -> None:
    """``{{ params.schema | tojson }}`` renders JSON; its braces are text, not fields."""
    schema = {"type": "object", "properties": {"label": {"enum": ["a", "b"]}}}
    template = "Reply to {q} matching {{ params.schema | tojson }}"
    operator = rendered_operator(template, params={"schema": schema})

    [message] = build_messages(operator.build_spec(), {"q": "hi"})

    assert message["content"] == "Reply to hi matching " + json.dumps(schema, sort_keys=True)  # as tojson


def test_format_specs_and_conversions_still_work() -> None:
    spec = BatchInferenceSpec.build(**REQUIRED, user_template='{score:.1f} {name!r} {"k": {n:>3}}')

    [message] = build_messages(spec, {"score": 2.25, "name": "x", "n": 7})

    assert message["content"] == "2.2 'x' {\"k\":   7}"


def test_a_field_that_is_not_a_column_names_the_column() -> None:
    spec = BatchInferenceSpec.build(**REQUIRED, user_template='Use {label} as {"label": 1}')

    with pytest.raises(ValueError, match="^missing column: user_template needs column 'label'"):
        build_messages(spec, {"Company": "Acme"})


# -- any text: a clear error at spec build, or a prompt holding the text's literal braces ----------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
json_strings = st.text(st.characters(exclude_characters="{}", codec="utf-8"), max_size=8)
json_values = st.recursive(
    json_scalars | json_strings,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(json_strings, inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=100, deadline=None)
@given(value=json_values, indent=st.sampled_from([None, 2]))
def test_any_json_example_survives_airflow_and_the_row_fill(value: Any, indent: int | None) -> None:  # Any
    example = json.dumps(value, indent=indent)
    operator = rendered_operator("Classify {Company} on {{ ds }}. Answer as " + example)

    [message] = build_messages(operator.build_spec(), {"Company": "Acme"})

    assert message["content"] == "Classify Acme on 2026-11-20. Answer as " + example


def _without_fields(text: str, values: dict[str, str]) -> str:
    pieces = parse_user_template(text)
    return "".join(piece if isinstance(piece, str) else values[piece.name] for piece in pieces)


@settings(max_examples=500, deadline=None)
@given(text=st.text(st.sampled_from("{}{}\"': !.[]0aAb \n"), min_size=1, max_size=40))
def test_any_text_is_refused_naming_user_template_or_keeps_its_literal_braces(text: str) -> None:
    try:
        spec = BatchInferenceSpec.build(**REQUIRED, user_template=text)
    except BatchSpecError as err:
        assert "user_template" in str(err)
        return
    names = template_fields(text)
    row = {name: "V" for name in names}
    try:
        [message] = build_messages(spec, row)
    except ValueError as err:  # a format spec that does not fit "V" ({a:d}): that row's error, naming it
        assert str(err).startswith("bad template value: column ")
        return
    prompt = message["content"]
    # Each field takes exactly one "{" and one "}" (its value "V" has none); every other brace is kept.
    assert prompt.count("{") == text.count("{") - len(names)
    assert prompt.count("}") == text.count("}") - len(names)
    if not names:
        assert prompt == text
    else:
        assert prompt.replace("V", "") == _without_fields(text, dict.fromkeys(names, "")).replace("V", "")
