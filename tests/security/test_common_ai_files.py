"""The request file the common.ai adapter writes for its job (common_ai/files.py) is written under
``result_path``, a folder common.ai names with no secret: a link planted at its name must not send the
write to another file."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from airflow_provider_raybatch.common_ai.files import write_lines


def test_a_link_planted_at_the_request_file_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "airflow.cfg"
    victim.write_text("[core]\n")
    folder = tmp_path / "result" / "_raybatch" / "key"
    folder.mkdir(parents=True)
    target = folder / "input-0123456789abcdef.jsonl"
    target.symlink_to(victim)

    assert write_lines(str(target), [{"custom_id": "k-0"}, {"custom_id": "k-1"}]) == 2

    assert victim.read_text() == "[core]\n"
    assert not target.is_symlink() and stat.S_IMODE(target.stat().st_mode) == 0o644
    written = [json.loads(line) for line in target.read_text().splitlines()]
    assert written == [{"custom_id": "k-0"}, {"custom_id": "k-1"}]
    assert sorted(path.name for path in folder.iterdir()) == [target.name]  # no temporary file left
