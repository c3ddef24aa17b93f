"""Job packaging, through the operator's real ``entrypoint()`` and ``_runtime_env()``: two ways it
could go wrong.

A spec over ~128 KiB (a long system prompt, a large JSON schema) could not start: the
whole spec was one ``sh -c`` argument, past the kernel's per-argument limit (``[Errno 7] Argument
list too long``). And the package of a ``preprocess`` module shipped every file in its
folder, ``.env`` and private keys included, to every node of the cluster.

No Ray: the uploads are recorded instead of sent (the cluster side of the spec runs through
``pipeline.__main__.shipped_spec`` on the unpacked package); tests/integration runs both for real.
"""

from __future__ import annotations

import io
import shlex
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_raybatch.operators.llm_batch import PIPELINE_MODULE, RayLLMBatchOperator
from airflow_provider_raybatch.pipeline.__main__ import shipped_spec
from airflow_provider_raybatch.shared.exceptions import BatchSpecError
from airflow_provider_raybatch.shared.packaging import JOB_MODULE, MAX_MODULE_BYTES, RayPackage
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

#: The kernel's limit on one argument (MAX_ARG_STRLEN: 32 pages of 4 KiB).
MAX_ARG_STRLEN = 128 * 1024
LEAKED = "AWS_SECRET_ACCESS_KEY=leaked/by/the/package"


class RecordingHook:
    """Stands in for RayHook.upload_package, the one hook call ``_runtime_env`` makes: records them."""

    def __init__(self) -> None:
        self.packages: list[RayPackage] = []

    def upload_package(self, package: RayPackage) -> str:
        self.packages.append(package)
        return package.uri

    def files_of(self, uri: str) -> dict[str, bytes]:
        [package] = [package for package in self.packages if package.uri == uri]
        with zipfile.ZipFile(io.BytesIO(package.data)) as archive:
            return {name: archive.read(name) for name in archive.namelist()}


def make_operator(**kwargs: object) -> RayLLMBatchOperator:
    arguments = {
        "task_id": "classify",
        "model": "Qwen/Qwen2.5-0.5B-Instruct",
        "input_uri": "/data/in/tickets.jsonl",
        "output_uri": "/data/out/",
        "user_template": "Classify: {text}",
        **kwargs,
    }
    return RayLLMBatchOperator(**arguments)


def large_schema(size: int) -> dict[str, object]:
    """A JSON schema of about ``size`` bytes: an enum of labels, each with a description, as product
    taxonomies have."""
    labels = [f"category-{i:05d}" for i in range(size // 120)]
    return {
        "type": "object",
        "properties": {
            "label": {"type": "string", "enum": labels},
            "why": {
                "type": "string",
                "description": " ".join(f"{label}: goods of kind {label}." for label in labels),
            },
        },
        "required": ["label"],
    }


# -- a spec over 128 KiB ------------------------------------------------------------------------


def test_a_300_kib_spec_keeps_the_entrypoint_short_and_reaches_the_cluster_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = "You classify tickets. Quote 'this' and \"that\"; never run `$(rm -rf /)`.\n" * 4200  # ~300 KiB
    op = make_operator(
        system_prompt=prompt,
        sampling_params={"max_tokens": 32, "structured_outputs": {"json": large_schema(100 * 1024)}},
    )
    spec = op.build_spec(run_key="big")
    assert len(spec.model_dump_json()) > 300 * 1024
    hook = RecordingHook()

    runtime_env = op._runtime_env(hook, spec)  # type: ignore[arg-type]
    entrypoint = op.entrypoint(spec)

    assert len(entrypoint.encode()) < 1024
    assert shlex.split(entrypoint) == [
        "python",
        "-m",
        PIPELINE_MODULE,
        "--spec-fingerprint",
        spec.fingerprint(),
    ]
    # Ray starts the entrypoint with Popen(entrypoint, shell=True): that exec is what failed (E2BIG).
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "python").write_text('#!/bin/sh\necho "started with $# arguments"\n')
    (fake_bin / "python").chmod(0o755)
    started = subprocess.run(
        entrypoint, shell=True, env={"PATH": f"{fake_bin}:/usr/bin:/bin"}, capture_output=True
    )
    assert started.stdout == b"started with 4 arguments\n", started.stderr
    # The cluster side: the job package Ray unpacks onto the driver's path holds the identical spec.
    [job_package] = [
        uri for uri in runtime_env["py_modules"] if f"{JOB_MODULE}/spec.json" in hook.files_of(uri)
    ]
    for name, data in hook.files_of(job_package).items():
        (tmp_path / "job" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "job" / name).write_bytes(data)
    monkeypatch.syspath_prepend(str(tmp_path / "job"))
    monkeypatch.delitem(sys.modules, JOB_MODULE, raising=False)
    try:
        rebuilt = shipped_spec(shlex.split(entrypoint)[-1])
    finally:
        sys.modules.pop(JOB_MODULE, None)
    assert rebuilt == spec
    assert rebuilt.system_prompt == prompt


def test_the_cluster_side_refuses_a_package_holding_another_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fingerprint in the entrypoint is checked, so a shadowing ``raybatch_job`` cannot swap the spec."""
    package = tmp_path / JOB_MODULE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "spec.json").write_text(
        make_operator(system_prompt="another job").build_spec().model_dump_json()
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, JOB_MODULE, raising=False)
    wanted = make_operator().build_spec().fingerprint()

    try:
        with pytest.raises(BatchSpecError, match=f"entrypoint names {wanted}"):
            shipped_spec(wanted)
    finally:
        sys.modules.pop(JOB_MODULE, None)


def test_the_cluster_side_without_a_job_package_says_how_to_submit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, JOB_MODULE, raising=False)

    with pytest.raises(BatchSpecError, match="RayLLMBatchOperator"):
        shipped_spec("0" * 16)


def test_spec_json_of_the_package_is_the_one_parser_input() -> None:
    """The job package holds exactly ``model_dump_json()``: BatchInferenceSpec.from_json rebuilds it."""
    spec = make_operator(system_prompt="é\u2028\x00" * 10).build_spec()
    hook = RecordingHook()

    runtime_env = make_operator()._runtime_env(hook, spec)  # type: ignore[arg-type]

    files = hook.files_of(runtime_env["py_modules"][-1])
    assert files[f"{JOB_MODULE}/spec.json"] == spec.model_dump_json().encode()
    assert BatchInferenceSpec.from_json(files[f"{JOB_MODULE}/spec.json"].decode()) == spec


# -- what a preprocess module's package ships ----------------------------------------------------


@pytest.fixture
def dag_author_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A DAG author's package beside the DAG, holding what a real project folder holds."""
    root = tmp_path / "dags"
    package = root / "raybatch_sec_pkg"
    files = {
        "__init__.py": "",
        "fns.py": "def pre(row):\n    return row\n",
        "prompts/template.txt": "Classify {text}.",
        "prompts/__init__.py": "",
        ".env": LEAKED,
        ".git/config": f'[remote "origin"]\n\turl = https://user:{LEAKED}@git.example.com/x.git\n',
        ".aws/credentials": f"[default]\n{LEAKED}\n",
        ".ssh/id_ed25519": LEAKED,
        "key.pem": f"-----BEGIN PRIVATE KEY-----\n{LEAKED}\n",
        "deploy/tls.key": LEAKED,
        "id_rsa": LEAKED,
        "venv/pyvenv.cfg": "home = /usr/bin\n",
        "venv/lib/python3.11/site-packages/leak.py": f"X = {LEAKED!r}\n",
        "node_modules/pkg/index.js": f"// {LEAKED}\n",
    }
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    (tmp_path / "outside_secret").write_text(LEAKED)
    (package / "linked.txt").symlink_to(tmp_path / "outside_secret")
    monkeypatch.syspath_prepend(str(root))
    yield package
    for name in [n for n in sys.modules if n.startswith("raybatch_sec_pkg")]:
        del sys.modules[name]


def test_the_preprocess_package_ships_code_and_templates_but_no_hidden_or_secret_file(
    dag_author_package: Path,
) -> None:
    op = make_operator(preprocess="raybatch_sec_pkg.fns.pre")
    spec = op.build_spec()
    hook = RecordingHook()

    op._runtime_env(hook, spec)  # type: ignore[arg-type]

    shipped = [hook.files_of(package.uri) for package in hook.packages]
    [files] = [files for files in shipped if any(name.startswith("raybatch_sec_pkg/") for name in files)]
    assert sorted(files) == [
        "raybatch_sec_pkg/__init__.py",
        "raybatch_sec_pkg/fns.py",
        "raybatch_sec_pkg/prompts/__init__.py",
        "raybatch_sec_pkg/prompts/template.txt",
    ]
    for package in hook.packages:
        assert all(LEAKED.encode() not in data for data in hook.files_of(package.uri).values())


def test_a_preprocess_package_holding_a_data_folder_fails_before_submitting(dag_author_package: Path) -> None:
    with open(dag_author_package / "prompts" / "corpus.bin", "wb") as sparse:  # sparse: no bytes written
        sparse.truncate(MAX_MODULE_BYTES + 1)
    op = make_operator(preprocess="raybatch_sec_pkg.fns.pre", postprocess="raybatch_sec_pkg.fns:pre")
    hook = RecordingHook()

    with pytest.raises(BatchSpecError) as info:
        op._runtime_env(hook, op.build_spec())  # type: ignore[arg-type]

    message = str(info.value)
    assert message.startswith(
        "preprocess='raybatch_sec_pkg.fns.pre' and postprocess='raybatch_sec_pkg.fns:pre'"
    )
    assert "raybatch_sec_pkg/prompts/corpus.bin (64.0 MiB)" in message
    assert hook.packages == []  # nothing was uploaded


def test_a_link_ships_only_what_would_ship_itself_and_secret_names_are_left_out(tmp_path) -> None:
    """``envcopy -> .env`` shipped the .env under the link's name, and
    ``prod.env``, ``credentials``, ``service-account.json``, ``keystore.jks``, ``putty.ppk``,
    ``secrets.toml`` and a conda environment shipped."""
    from airflow_provider_raybatch.shared.packaging import build_py_module_package

    package = tmp_path / "mypre"
    (package / ".aws").mkdir(parents=True)
    (package / ".aws" / "credentials").write_text("aws_secret_access_key=LEAK1")
    (package / ".env").write_text("AWS_SECRET=LEAK2")
    (package / "id_rsa").write_text("LEAK3")
    (package / "prompts").mkdir()
    (package / "prompts" / "template.txt").write_text("Classify {name}.")
    (package / "__init__.py").write_text("")
    for name in (
        "prod.env",
        "credentials",
        "service-account.json",
        "keystore.jks",
        "putty.ppk",
        "secrets.toml",
    ):
        (package / name).write_text("LEAK4")
    (package / "condaenv" / "conda-meta").mkdir(parents=True)
    (package / "condaenv" / "lib.py").write_text("LEAK5")
    for link, target in (
        ("envcopy", ".env"),
        ("aws_link", ".aws/credentials"),
        ("id_link", "id_rsa"),
        ("template_link.txt", "prompts/template.txt"),
    ):
        (package / link).symlink_to(package / target)

    import io
    import zipfile

    shipped = zipfile.ZipFile(io.BytesIO(build_py_module_package(package).data))
    names = set(shipped.namelist())
    assert names == {"mypre/__init__.py", "mypre/prompts/template.txt", "mypre/template_link.txt"}
    assert not any(b"LEAK" in shipped.read(name) for name in names)
