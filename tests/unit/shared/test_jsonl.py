"""Tests of airflow_provider_raybatch/shared/jsonl.py: one line rule for the readers and the
API's count."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_raybatch.shared.jsonl import BYTE_ORDER_MARK, count_requests, split_lines


def lines_of(data: bytes) -> list[tuple[int, bytes]]:
    return list(split_lines(data))


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(b"", [], id="empty"),
        pytest.param(b"a", [(1, b"a")], id="no-final-newline"),
        pytest.param(b"a\nb\n", [(1, b"a"), (2, b"b")], id="lf"),
        pytest.param(b"a\r\nb\r\n", [(1, b"a"), (2, b"b")], id="crlf-drops-the-cr"),
        pytest.param(b"a\rb\n", [(1, b"a\rb")], id="bare-cr-stays-in-its-line"),
        pytest.param(b"a\r\r\n", [(1, b"a\r")], id="only-the-last-cr-goes"),
        pytest.param(b"\n \n\t\r\n\x0b\x0c\nx\n\n", [(5, b"x")], id="blank-lines-numbered-not-yielded"),
        pytest.param(b"\r", [], id="a-lone-cr-is-blank"),
        pytest.param(BYTE_ORDER_MARK + b"a\nb", [(1, b"a"), (2, b"b")], id="byte-order-mark"),
        pytest.param(BYTE_ORDER_MARK + b"\na", [(2, b"a")], id="byte-order-mark-then-blank"),
        pytest.param(b"a" + BYTE_ORDER_MARK + b"\n", [(1, b"a" + BYTE_ORDER_MARK)], id="mark-not-at-start"),
        # U+2028, U+0085 and a form feed are not line breaks in JSON Lines
        pytest.param(
            "a\u2028b\u0085c\n".encode(), [(1, "a\u2028b\u0085c".encode())], id="unicode-separators"
        ),
        pytest.param(b"a\x0cb\n", [(1, b"a\x0cb")], id="form-feed"),
    ],
)
def test_split_lines(data: bytes, expected: list[tuple[int, bytes]]) -> None:
    assert lines_of(data) == expected
    assert count_requests([data]) == len(expected)


def test_count_requests_of_no_chunks_is_zero() -> None:
    assert count_requests([]) == 0
    assert count_requests([b"", b""]) == 0


@pytest.mark.parametrize(
    "chunks",
    [
        [b"ab", b"c\n"],  # one line across chunks is one request
        [b"  ", b"x", b"  \n"],  # blank start, content in the next chunk
        [b"x", b"\n"],
        [b"x\n", b"", b"  \n"],
        [b"\xef", b"\xbb", b"\xbfx"],  # a byte order mark cut over three chunks
    ],
)
def test_count_requests_across_chunk_edges(chunks: list[bytes]) -> None:
    assert count_requests(chunks) == 1 == len(lines_of(b"".join(chunks)))


def test_a_byte_order_mark_cut_then_blank_counts_nothing() -> None:
    assert count_requests([b"\xef\xbb", b"\xbf \n"]) == 0


_BYTES = st.lists(
    st.sampled_from(
        [b"\n", b"\r", b"\r\n", b" ", b"\t", b"\x0b", b"\x0c", b"x", b"{}", b"\xef\xbb\xbf", b"\xff"]
    ),
    max_size=40,
).map(b"".join) | st.binary(max_size=64)


@given(_BYTES, st.lists(st.integers(min_value=0, max_value=64), max_size=8))
@settings(max_examples=400, deadline=None)
def test_property_count_matches_split_for_any_chunking(data: bytes, cuts: list[int]) -> None:
    edges = sorted({min(cut, len(data)) for cut in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in zip(edges, edges[1:], strict=False)]

    lines = lines_of(data)

    assert count_requests(chunks) == len(lines)
    # Each line is numbered by the newlines before it, and is what lies between them.
    physical = data.removeprefix(BYTE_ORDER_MARK).split(b"\n")
    for number, line in lines:
        assert line == physical[number - 1].removesuffix(b"\r")
        assert line.strip()
    assert [n for n, _ in lines] == [n for n, raw in enumerate(physical, start=1) if raw.strip()]


def test_module_imports_no_heavy_library() -> None:
    """The API server imports this module: no Ray, pyarrow or Airflow come with it."""
    code = (
        "import sys, airflow_provider_raybatch.shared.jsonl\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'pyarrow', 'airflow', 'vllm')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
