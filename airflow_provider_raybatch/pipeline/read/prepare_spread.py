"""Where the rows of an input of one large file are prepared: in tasks across the cluster, not in the
task that read the file.

Ray Data reads an input file in one task and fuses the steps after it into that task: parsing the file
(:func:`..row_steps.parse_file_row`) and preparing each row (:func:`..row_steps.prepare_row`: the
author's ``preprocess``, the prompt, its checks) then run on one core. The seeds' input is one file:
200,000 rows of a 28 MiB CSV took 12.9 s there on a 16-core GPU host, while the engine waited for
them (bench/RESULTS.md 19), and 2,000,000 rows 217.6 s (7e). So where the input is one file this
large, its parsed rows are cut into blocks of :data:`ROWS_PER_BLOCK` (Ray Data's streaming
repartition: no barrier, the blocks go on as the parse hands them over), and each block is prepared
in a task of its own.

Not spread:

* a smaller file: a warm job of 2,000 rows would pay one more operator, its tasks and their objects,
  before its first row, for a prepare that takes a tenth of a second;
* an input of several files: each is read and prepared in a task of its own already, and the
  repartition joins rows across blocks, so a block could hold the rows of many files (rows of up
  to 32 MiB each); of one file, a block is never larger than the file, which the read task holds
  whole (:data:`.rows.MAX_INPUT_FILE_BYTES`).

Parsing stays in the read task: a CSV's quoted field may hold a newline, so a file cannot be cut by
bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from ray.data import Dataset

#: From this size, the rows of an input of one file are prepared in tasks of their own.
SPREAD_FROM_BYTES: Final = 8 * 2**20
#: Rows a prepare task takes: 200,000 rows make 25 tasks, a few per core of a GPU host.
ROWS_PER_BLOCK: Final = 8192


def spreads(file_sizes: Sequence[int], spread_from_bytes: int = SPREAD_FROM_BYTES) -> bool:
    """Whether an input of files of ``file_sizes`` bytes is prepared in tasks of its own: one file,
    of at least ``spread_from_bytes``."""
    return len(file_sizes) == 1 and file_sizes[0] >= spread_from_bytes


def spread(
    records: Dataset,
    file_sizes: Sequence[int],
    spread_from_bytes: int = SPREAD_FROM_BYTES,
    rows_per_block: int = ROWS_PER_BLOCK,
) -> Dataset:
    """``records`` (the parsed rows of files of ``file_sizes`` bytes), cut into blocks of
    ``rows_per_block`` where :func:`spreads`."""
    if not spreads(file_sizes, spread_from_bytes):
        return records
    return records.repartition(target_num_rows_per_block=rows_per_block)
