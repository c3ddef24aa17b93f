"""Check the built sdist and wheel hold what the provider needs at run time (scripts/test_wheel.sh runs it).

usage: python scripts/check_dist.py DIST_FOLDER

- The wheel holds every file git tracks under ``airflow_provider_raybatch/`` (code and any data file
  it reads: templates, JSON, static files), nothing else of the package (a stray file a developer has
  not added to git, byte code), and no other top-level folder than the package and its dist-info.
- The sdist holds every one of those files too, and every tracked file of ``tests/``, with
  ``pyproject.toml``, ``README.md`` and ``CHANGELOG.md``: it builds the wheel, and the tests run from it.
- The wheel's version is the one of ``pyproject.toml`` and of ``airflow_provider_raybatch.__version__``.
- Its entry points name the provider info Airflow reads and the OpenAI Batch API plugin.

Standard library only: it runs before anything is installed from the wheel.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "airflow_provider_raybatch"
ENTRY_POINTS = (
    "[apache_airflow_provider]\nprovider_info = airflow_provider_raybatch:get_provider_info",
    "[airflow.plugins]\n"
    "raybatch_openai_batch_api = airflow_provider_raybatch.openai_api.plugin:RayBatchOpenAIPlugin",
)


def tracked_files(folder: str) -> set[str]:
    """The files git tracks under ``folder`` (paths relative to the repository root)."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--", folder], capture_output=True, check=True
    ).stdout.decode()
    files = {name for name in listed.split("\0") if name}
    if not files:
        raise SystemExit(f"check_dist: git tracks no file under {folder}/: run this from a git checkout.")
    return files


def one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    if len(found) != 1:
        raise SystemExit(f"check_dist: expected one {pattern} in {folder}, found {[p.name for p in found]}.")
    return found[0]


def main(dist: Path) -> list[str]:
    """The problems found (empty: the distributions are complete); prints what it checked."""
    problems: list[str] = []
    tracked = tracked_files(PACKAGE)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

    wheel_path = one(dist, "*.whl")
    with zipfile.ZipFile(wheel_path) as wheel:
        names = [info.filename for info in wheel.infolist() if not info.is_dir()]
        dist_info = f"{PACKAGE}-{version}.dist-info/"
        in_package = {name for name in names if name.startswith(f"{PACKAGE}/")}
        others = [name for name in names if not name.startswith((f"{PACKAGE}/", dist_info))]
        metadata, entry_points, init = (
            wheel.read(name).decode() if name in names else ""
            for name in (f"{dist_info}METADATA", f"{dist_info}entry_points.txt", f"{PACKAGE}/__init__.py")
        )
    if missing := sorted(tracked - in_package):
        problems.append(f"the wheel lacks {len(missing)} tracked file(s) of the package: {missing[:10]}")
    if extra := sorted(in_package - tracked):
        problems.append(
            f"the wheel holds package files git does not track (git add or delete them): {extra[:10]}"
        )
    if others:
        problems.append(f"the wheel holds files outside {PACKAGE}/ and its dist-info: {others[:10]}")
    wheel_version = re.search(r"^Version: (\S+)$", metadata, re.MULTILINE)
    if not wheel_version or wheel_version.group(1) != version:
        found = wheel_version and wheel_version.group(1)
        problems.append(f"the wheel's METADATA Version is {found!r}, pyproject.toml's {version!r}")
    code_version = re.search(r'^__version__ = "([^"]+)"$', init, re.MULTILINE)
    if not code_version or code_version.group(1) != version:
        found = code_version and code_version.group(1)
        problems.append(f"{PACKAGE}.__version__ is {found!r}, pyproject.toml's {version!r}")
    for entry_point in ENTRY_POINTS:
        if entry_point not in entry_points:
            problems.append(f"the wheel's entry_points.txt lacks {entry_point!r}")

    sdist_path = one(dist, "*.tar.gz")
    with tarfile.open(sdist_path) as sdist:
        members = {member.name for member in sdist.getmembers() if member.isfile()}
    top = f"{PACKAGE}-{version}/"
    needed = {
        f"{top}{name}"
        for name in tracked | tracked_files("tests") | {"pyproject.toml", "README.md", "CHANGELOG.md"}
    }
    if missing := sorted(needed - members):
        problems.append(f"the sdist lacks {len(missing)} file(s): {missing[:10]}")

    print(
        f"check_dist: {wheel_path.name}: {len(names)} files, {len(in_package)} under {PACKAGE}/ "
        f"({len(tracked)} tracked by git there); {sdist_path.name}: {len(members)} files; version {version}"
    )
    return problems


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    found = main(Path(sys.argv[1]))
    for problem in found:
        print(f"check_dist: {problem}", file=sys.stderr)
    sys.exit(1 if found else 0)
