"""Where one JSON Lines request ends: the one rule the pipeline's readers and the API's count share.

The OpenAI-compatible API counts a batch file's requests when the batch is created
(``request_total``) and the pipeline later reads the same bytes into rows and error rows. If the two
split lines differently, a batch reports a total that its rows never reach (``bytes.splitlines``
made one line with a bare ``\\r`` in it two error rows). So both use this module:

* a line ends at ``\\n`` only. A bare ``\\r`` belongs to its line: between JSON tokens it is
  whitespace and the line parses; inside a string it is a raw control character, so the line is
  invalid JSON and fails alone. The ``\\r`` of a CRLF line ending is dropped with its ``\\n``;
* a line that is blank after ``bytes.strip()`` (ASCII whitespace only) is no request and no row;
* a UTF-8 byte order mark at the very start of the data belongs to no line;
* lines are numbered from 1 by ``\\n`` (blank lines count), so ``<file>:<n>`` names the n-th line.

No Ray, pyarrow or Airflow here: the API server imports it too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

#: The UTF-8 byte order mark some editors write at the start of a file.
BYTE_ORDER_MARK = b"\xef\xbb\xbf"
#: ASCII whitespace (what ``bytes.strip()`` removes) other than the line break itself.
_BLANK_BUT_NEWLINE = b" \t\r\x0b\x0c"
#: :func:`count_requests` looks at a chunk this much at a time, so that the pieces one ``split()``
#: makes stay small however large a chunk is.
_COUNT_PIECE_BYTES = 1 << 20
_NEWLINE = 0x0A
_NOT_BLANK = re.compile(rb"[^ \t\r\n\x0b\x0c]")


def split_lines(data: bytes, max_bytes: int | None = None) -> Iterator[tuple[int, bytes]]:
    """Each request line of ``data`` with its line number, blank lines left out (see the module docstring).

    Lazy and one line at a time: a file's lines are never all in memory at once beside ``data``.
    ``max_bytes``: a line longer is yielded as its first ``max_bytes + 1`` bytes, not copied whole
    (its length tells it is too long; the caller refuses it).
    """
    start = len(BYTE_ORDER_MARK) if data.startswith(BYTE_ORDER_MARK) else 0
    end = len(data)
    number = 0
    while start < end:
        stop = data.find(b"\n", start)
        if stop < 0:
            stop = end
        number += 1
        if max_bytes is not None and stop - start > max_bytes + 1:
            line_start, start = start, stop + 1
            if _NOT_BLANK.search(data, line_start, stop):  # a long line is blank only if all whitespace
                yield number, data[line_start : line_start + max_bytes + 1]
            continue
        line = data[start:stop]
        start = stop + 1
        # isspace(): the same ASCII whitespace as strip(), without copying a long line.
        if line and not line.isspace():
            yield number, line.removesuffix(b"\r")


def count_requests(chunks: Iterable[bytes]) -> int:
    """How many lines :func:`split_lines` would yield for the concatenation of ``chunks``.

    Streaming and linear in the data's size, whatever the chunking and however long a line: a
    128 MiB line with no newline is counted in a fraction of a second, in about 1 MiB of memory
    beyond the chunk being read.
    """
    count = 0
    # The line read so far has a non-blank byte (and is counted already): the next chunk may go on with it.
    line_counted = False
    for chunk in _without_byte_order_mark(chunks):
        for offset in range(0, len(chunk), _COUNT_PIECE_BYTES):
            # With the other whitespace gone, a request line is a run of non-newline bytes.
            text = chunk[offset : offset + _COUNT_PIECE_BYTES].translate(None, _BLANK_BUT_NEWLINE)
            if not text:
                continue
            runs = len(text.split())  # "\n" is the only whitespace left: split() yields the runs
            if line_counted and text[0] != _NEWLINE:
                runs -= 1  # the first run goes on with the line already counted
            count += runs
            line_counted = text[-1] != _NEWLINE
    return count


def _without_byte_order_mark(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """``chunks`` with a byte order mark at the start of the data removed, wherever the chunks cut it."""
    iterator = iter(chunks)
    head = b""
    for chunk in iterator:
        head += chunk
        if len(head) >= len(BYTE_ORDER_MARK):
            break
    yield head.removeprefix(BYTE_ORDER_MARK)
    yield from iterator
