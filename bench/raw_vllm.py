"""(a) The baseline: the same batch with raw vLLM ``LLM.generate`` in one plain process.

Reads the job spec our operator builds (bench/compare.py and bench/gpu/make_submissions.py write it),
so the model, engine arguments, sampling parameters, input and prompts are exactly the pipeline's:

* the input files are the spec's (``input_uri``, its format: JSONL, CSV or Parquet) and each is read
  with the pipeline's own parser (``pipeline/read/rows.py`` ``parse_file``) and each row prepared with its
  own ``prepare_row`` (``pipeline/row_steps.py``: id, template, system prompt, sampling parameters,
  ``build_messages``), so the rows the pipeline would reject (no id, an empty template column, a
  malformed line) are left out here too, and a repeated id keeps its first row only, as the
  pipeline's duplicate check does;
* each conversation goes through the model's chat template and tokenizer as Ray Data LLM's
  chat-template and tokenize stages do (and ``pipeline/prompt/chat_template.py``), and ``LLM.generate`` gets
  the token ids with ``SamplingParams(**sampling_params)``, ``structured_outputs`` (e.g. a ``choice``)
  as ``StructuredOutputsParams``, exactly as Ray Data LLM's vLLM stage builds them.

What a lean script does at scale, not one row at a time in one process: the file's lines are cut into
chunks that ``--workers`` processes parse, prepare, template and tokenize while this process imports
vLLM and builds the engine (the rows of a chunk keep the pipeline's semantics; the cut assumes one
record per line, as JSONL and the generated CSVs have: a CSV with newlines inside quotes would need
``--workers 0``). ``LLM.generate`` then takes ``--chunk`` prompts per call.

Outputs are written as one Parquet file (id, kept columns, generated_text, token counts), then a JSON
result with wall-clock timestamps (``time.time()``) so the caller can line them up with its own.

usage: python bench/raw_vllm.py SPEC_JSON_FILE OUT_DIR [--workers N] [--chunk N] [--prepare-lines N]
                               [--engine-kwargs JSON]
       (run with the Ray/vLLM environment; --engine-kwargs is laid over the spec's, e.g. for vLLM's CPU build)
"""

from __future__ import annotations

import time

T_PROCESS = time.time()  # as early as possible: "from process start" is measured from here too

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the provider's spec and row code; the Ray env does not install it

#: Lines per prepare task: enough to amortise a task, small enough to spread over the workers.
CHUNK_LINES = 50_000
#: Conversations per tokenizer call, as Ray Data LLM's tokenize stage takes a batch at a time.
TOKENIZE_BATCH = 256

_worker: dict[str, Any] = {}  # Any: the worker's spec and tokenizer


def _init_worker(spec_json: str) -> None:
    from transformers import AutoTokenizer

    from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

    spec = BatchInferenceSpec.from_json(spec_json)
    _worker["spec"] = spec
    _worker["tokenizer"] = AutoTokenizer.from_pretrained(spec.model)


def _render(tokenizer: Any, conversation: list[dict[str, Any]]) -> str:  # Any: a tokenizer, JSON.
    """pipeline/prompt/chat_template.py's ``_render``: what Ray Data LLM's chat-template loop does for
    one row."""
    add_generation_prompt = bool(conversation) and conversation[-1].get("role") == "user"
    return tokenizer.apply_chat_template(
        conversation,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=not add_generation_prompt,
    )


def prepare_chunk(
    name: str, data: bytes, input_format: str, first_row: int
) -> dict[str, Any]:  # Any: results.
    """Parse, prepare, template and tokenize one chunk of a file (its header, for CSV, included).

    :param first_row: the file's row number of the chunk's first row, less one (sources as the pipeline's).
    """
    import numpy as np

    from airflow_provider_raybatch.pipeline import row_steps
    from airflow_provider_raybatch.pipeline.read.rows import parse_file

    spec, tokenizer = _worker["spec"], _worker["tokenizer"]
    t0 = time.time()
    ids: list[str] = []
    kept: list[str] = []
    texts: list[str] = []
    errors: Counter[str] = Counter()
    rows = 0
    for record in parse_file(name, data, input_format, id_column=spec.id_column):  # type: ignore[arg-type]
        rows += 1
        file_name, _, number = record["source"].rpartition(":")
        record["source"] = f"{file_name}:{int(number) + first_row}" if number.isdigit() else record["source"]
        prepared = row_steps.prepare_row(record, spec)
        if prepared["error"] is not None:
            errors[prepared["error"].split(":")[0]] += 1
            continue
        row = json.loads(prepared["row"])
        columns = spec.keep_columns if spec.keep_columns is not None else list(row)
        kept.append(json.dumps({column: row.get(column) for column in columns}, ensure_ascii=False))
        ids.append(prepared["id"])
        if prepared["messages"] is not None:
            texts.append(_render(tokenizer, json.loads(prepared["messages"])))
        else:
            texts.append(prepared["prompt"])
    t1 = time.time()
    token_ids: list[list[int]] = []
    for start in range(0, len(texts), TOKENIZE_BATCH):
        token_ids.extend(tokenizer(texts[start : start + TOKENIZE_BATCH])["input_ids"])
    lengths = np.array([len(ids_) for ids_ in token_ids], dtype=np.int64)
    flat = np.fromiter((t for ids_ in token_ids for t in ids_), dtype=np.int32, count=int(lengths.sum()))
    return {
        "rows": rows,
        "ids": ids,
        "kept": kept,
        "tokens": flat,
        "offsets": np.concatenate([[0], np.cumsum(lengths)]),
        "errors": dict(errors),
        "parse_prepare_template_s": t1 - t0,
        "tokenize_s": time.time() - t1,
    }


def _chunks(
    name: str, data: bytes, input_format: str, lines_per_chunk: int
) -> list[tuple[str, bytes, str, int]]:
    """(name, bytes, format, first row - 1) per chunk: whole lines; CSV chunks start with the header."""
    if input_format == "parquet" or lines_per_chunk <= 0:
        return [(name, data, input_format, 0)]
    header = b""
    body_start = 0
    if input_format == "csv":
        body_start = data.find(b"\n") + 1 if b"\n" in data else len(data)
        header = data[:body_start]
    out = []
    position, row = body_start, 0
    while position < len(data):
        end = position
        for _ in range(lines_per_chunk):
            end = data.find(b"\n", end)
            if end < 0:
                end = len(data)
                break
            end += 1
        out.append((name, header + data[position:end], input_format, row))
        row += data.count(b"\n", position, end) + (0 if data[end - 1 : end] == b"\n" else 1)
        position = end
    return out


def sampling_params_of(spec_sampling: dict[str, Any]) -> Any:  # Any: vllm.SamplingParams.
    """As Ray Data LLM's vLLM stage builds them: ``structured_outputs`` as ``StructuredOutputsParams``."""
    import vllm

    params = dict(spec_sampling)
    structured = params.pop("structured_outputs", None)
    if not structured:
        return vllm.SamplingParams(**params)
    try:
        from vllm.sampling_params import StructuredOutputsParams
    except ImportError:  # an older vLLM: the guided-decoding names
        from vllm.sampling_params import GuidedDecodingParams

        return vllm.SamplingParams(**params, guided_decoding=GuidedDecodingParams(**structured))
    return vllm.SamplingParams(**params, structured_outputs=StructuredOutputsParams(**structured))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec_file", type=Path)
    parser.add_argument("out_dir", type=Path)
    cpus = os.cpu_count() or 1
    parser.add_argument(
        "--workers",
        type=int,
        default=min(16, cpus) - 2 if cpus > 4 else 0,
        help="processes that prepare the rows beside the engine's start (0: in this process; "
        "default: the cores less two, none on a machine of 4 cores or fewer)",
    )
    parser.add_argument("--chunk", type=int, default=200_000, help="prompts per LLM.generate call (0: all)")
    parser.add_argument("--prepare-lines", type=int, default=CHUNK_LINES, help="input lines per prepare task")
    parser.add_argument("--engine-kwargs", default="{}", help="JSON laid over the spec's engine_kwargs")
    args = parser.parse_args()

    from airflow_provider_raybatch.pipeline import storage
    from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

    spec_json = args.spec_file.read_text()
    spec = BatchInferenceSpec.from_json(spec_json)
    input_format = spec.resolved_input_format
    files = sorted(
        storage.input_file_sizes(spec.input_uri, storage.extensions_for(spec.input_uri, input_format))
    )
    tasks = []
    for path, _ in files:
        data = Path(path).read_bytes()  # local input (the benchmark's); the pipeline also reads S3
        name = storage.relative_name(path, spec.input_uri)
        tasks.extend(_chunks(name, data, input_format, args.prepare_lines if args.workers else 0))
    t_read = time.time()

    pool = None
    if args.workers:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # spawn: the workers start clean, before this process imports vLLM and torch
        pool = ProcessPoolExecutor(
            args.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(spec_json,),
        )
        futures = [pool.submit(prepare_chunk, *task) for task in tasks]
    else:
        futures = None

    t_import = time.time()
    from vllm import LLM

    t_engine = time.time()
    engine_kwargs = {**spec.engine_kwargs, **json.loads(args.engine_kwargs)}
    llm = LLM(model=spec.model, **engine_kwargs)
    t_ready = time.time()

    if futures is not None:
        results = [future.result() for future in futures]
        assert pool is not None
        pool.shutdown()
    else:
        _init_worker(spec_json)
        results = [prepare_chunk(*task) for task in tasks]
    t_prepared = time.time()

    # The pipeline's duplicate rule: an id's first row (in file order) is processed, later ones fail.
    seen: set[str] = set()
    keep: list[tuple[int, int]] = []  # (result, row in result)
    errors: Counter[str] = Counter()
    rows_in = 0
    for index, result in enumerate(results):
        rows_in += result["rows"]
        errors.update(result["errors"])
        for position, row_id in enumerate(result["ids"]):
            if row_id in seen:
                errors["duplicate id"] += 1
                continue
            seen.add(row_id)
            keep.append((index, position))
    del seen
    t_deduped = time.time()

    def prompt(index: int, position: int) -> dict[str, list[int]]:
        result = results[index]
        start, end = result["offsets"][position], result["offsets"][position + 1]
        return {"prompt_token_ids": result["tokens"][start:end].tolist()}

    sampling = sampling_params_of(spec.sampling_params)
    chunk = args.chunk or len(keep) or 1
    generated: list[tuple[str, int, int, str | None]] = []
    t_gen = time.time()
    for start in range(0, len(keep), chunk):
        prompts = [prompt(index, position) for index, position in keep[start : start + chunk]]
        for out in llm.generate(prompts, sampling, use_tqdm=False):
            completion = out.outputs[0]
            generated.append(
                (
                    completion.text,
                    len(out.prompt_token_ids),
                    len(completion.token_ids),
                    completion.finish_reason,
                )
            )
    t_gen_end = time.time()

    import pyarrow as pa
    import pyarrow.parquet as pq

    id_column = spec.id_column or "row_id"
    records = []
    for (index, position), (text, tokens_in, tokens_out, _) in zip(keep, generated, strict=True):
        result = results[index]
        records.append(
            {
                id_column: result["ids"][position],
                **json.loads(result["kept"][position]),
                "generated_text": text,
                "num_input_tokens": tokens_in,
                "num_generated_tokens": tokens_out,
            }
        )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), args.out_dir / "outputs.parquet")
    t_written = time.time()

    choice = (spec.sampling_params.get("structured_outputs") or {}).get("choice")
    finish = Counter(reason for *_, reason in generated)
    result_json = {
        "t_process": T_PROCESS,
        "t_read_done": t_read,
        "t_import_vllm": t_import,
        "t_engine_start": t_engine,
        "t_engine_ready": t_ready,
        "t_prepared": t_prepared,
        "t_deduped": t_deduped,
        "t_generate_start": t_gen,
        "t_generate_end": t_gen_end,
        "t_outputs_written": t_written,
        "rows_in": rows_in,
        "rows_rejected_before_engine": sum(errors.values()),
        "errors_by_reason": dict(errors),
        "rows": len(generated),
        "tokens_in": sum(g[1] for g in generated),
        "tokens_out": sum(g[2] for g in generated),
        "finish_reasons": dict(finish),
        # the pipeline fails a choice row cut short by max_tokens ("length"); here it is only counted
        "choice_cut_short": finish.get("length", 0) if choice else 0,
        "generated_text_counts": dict(Counter(g[0] for g in generated).most_common(20)),
        "workers": args.workers,
        "generate_chunk": chunk,
        "prepare_chunks": len(tasks),
        "prepare_worker_s": sum(r["parse_prepare_template_s"] + r["tokenize_s"] for r in results),
        "tokenize_worker_s": sum(r["tokenize_s"] for r in results),
        "engine_kwargs": engine_kwargs,
        "peak_rss_bytes_self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "torch_threads": _torch_threads(),
        "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }
    (args.out_dir / "raw_result.json").write_text(json.dumps(result_json, indent=1))
    print("RAW_RESULT " + json.dumps(result_json), flush=True)


def _torch_threads() -> int | None:
    try:
        import torch

        return torch.get_num_threads()
    except Exception:  # noqa: BLE001 - informational only
        return None


if __name__ == "__main__":
    main()
