"""Tests of airflow_provider_raybatch/pipeline/private_folders.py: folders only the Ray user can write.

Its users' hostile cases are tests/security/test_model_cache.py and tests/security/test_compile_cache.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_provider_raybatch.pipeline.private_folders import (
    PrivateFolderError,
    check_private,
    make_private_folders,
)

SETTING = "model_cache_dir='/cache'"


def test_missing_folders_are_made_private(tmp_path: Path) -> None:
    old = os.umask(0o002)  # a umask that would leave folders group-writable
    try:
        make_private_folders(str(tmp_path / "a" / "root"), str(tmp_path / "a" / "root" / "b" / "c"), SETTING)
    finally:
        os.umask(old)

    made = [
        tmp_path / "a",
        tmp_path / "a" / "root",
        tmp_path / "a" / "root" / "b",
        tmp_path / "a" / "root" / "b" / "c",
    ]
    assert [oct(path.stat().st_mode & 0o777) for path in made] == [oct(0o700)] * 4


def test_an_existing_folder_readable_by_others_is_made_private(tmp_path: Path) -> None:
    """A cache made by an older provider, or by vLLM or Triton themselves (0755): it and the folders
    made below it are private, or every local user read the compiled code and weights in it."""
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    (root / "a").mkdir(mode=0o755)
    (root / "a").chmod(0o755)

    make_private_folders(str(root), str(root / "a" / "m"), SETTING)

    assert [oct(path.stat().st_mode & 0o777) for path in (root, root / "a", root / "a" / "m")] == [
        oct(0o700)
    ] * 3


def test_a_folder_only_under_the_root() -> None:
    with pytest.raises(ValueError, match="not under"):
        make_private_folders("/cache/root", "/cache/rootless/m", SETTING)


def test_a_link_above_the_root_into_a_folder_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (tmp_path / "link").symlink_to(shared)

    with pytest.raises(PrivateFolderError, match="without the sticky bit") as refused:
        make_private_folders(str(tmp_path / "link" / "root"), str(tmp_path / "link" / "root"), SETTING)

    assert str(shared) in str(refused.value)
    assert not (shared / "root").exists()


def test_a_link_above_the_root_into_a_private_folder_is_fine(tmp_path: Path) -> None:
    """Such as /tmp linked to /private/tmp, or a home folder on another volume."""
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")

    make_private_folders(str(tmp_path / "link" / "root"), str(tmp_path / "link" / "root" / "m"), SETTING)

    assert (tmp_path / "real" / "root" / "m").is_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder another user's needs root")
def test_a_folder_above_the_root_of_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)

    with pytest.raises(PrivateFolderError, match="above it.*owned by uid 65534"):
        make_private_folders(str(theirs / "root"), str(theirs / "root"), SETTING)


def test_check_private_names_the_setting_the_path_and_the_fix(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")

    with pytest.raises(PrivateFolderError) as refused:
        check_private(str(tmp_path / "f"), SETTING)

    message = str(refused.value)
    assert message.startswith(f"{SETTING}: {str(tmp_path / 'f')!r} is not a folder")
    assert f"uid {os.geteuid()}" in message and "delete this one" in message
