"""Counting an upload's requests stays linear (it was quadratic).

``_count_requests`` did ``rest + chunk`` per 1 MiB chunk, so a newline-free 128 MiB upload cost 9.4 s
of CPU holding the GIL in the API server (4x per doubling), and held a copy of everything read so
far. The count now keeps only the current line's blankness: its memory does not grow with the input,
which is what this checks (deterministically; time is for bench/, not tests). The count itself is
the pipeline's rule (shared/jsonl.py), so the API's total is the rows the job reports.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator

from airflow_provider_raybatch.shared.jsonl import count_requests

MIB = 1 << 20


def _chunks(total_mib: int, piece: bytes) -> Iterator[bytes]:
    chunk = piece * (MIB // len(piece))
    for _ in range(total_mib):
        yield chunk


def _peak_bytes_counting(total_mib: int, piece: bytes) -> tuple[int, int]:
    tracemalloc.start()
    try:
        count = count_requests(_chunks(total_mib, piece))
        return count, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_newline_free_upload_is_counted_in_memory_that_does_not_grow_with_it() -> None:
    count, peak = _peak_bytes_counting(128, b"x")
    assert count == 1
    # Two 1 MiB chunks alive at once (the generator's and the one being looked at) plus small change;
    # the quadratic count held all 128 MiB read so far.
    assert peak < 8 * MIB, peak


def test_lines_across_chunk_edges_are_counted_once() -> None:
    piece = b'{"a": 1}\n  \n\t\r\n{"b":\r2}\n{"c'  # 27 bytes: lines cut at every chunk edge
    count, peak = _peak_bytes_counting(16, piece)
    assert peak < 8 * MIB
    lines = b"".join(_chunks(16, piece)).split(b"\n")
    assert count == sum(1 for line in lines if line.strip())
