"""torch Inductor keeps more than its cache in ``<tempdir>/torchinductor_<user>``: whatever
``TORCHINDUCTOR_CACHE_DIR`` the replica sets (pipeline/generate/engine_caches.py), the C++ headers it
precompiles for CPU kernels go to ``default_cache_dir()/precompiled_headers``
(``torch/_inductor/codecache.py``: ``_HEADER_DIR``), which is that /tmp folder, always.

Another local user who makes that folder first owns what the engine compiles into every CPU kernel:
an existing ``<hash>.h`` is not written again (``write`` keeps a file that exists) and is compiled into
the kernel's ``.so``, which the replica loads, so a planted line runs as the Ray user. The replica turns
precompiled headers off (``engine_caches.turn_off_precompiled_headers``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.pipeline.ray_env import run_in_ray_env

pytestmark = pytest.mark.usefixtures("usual_umask")  # tests/security/conftest.py

#: The snippet: the real replica UDF names and checks its caches (Ray Data LLM's engine build stubbed),
#: then torch compiles one CPU kernel with the environment the replica left, as its EngineCore would.
_COMPILE_IN_REPLICA = """
import getpass, json, os
os.environ["TMPDIR"] = SHARED  # a /tmp look-alike, set before torch is imported
PLANTED = os.path.join(SHARED, "torchinductor_" + getpass.getuser())
os.makedirs(PLANTED)
os.chmod(PLANTED, 0o777)
if os.geteuid() == 0:
    os.chown(PLANTED, 65534, 65534)  # another local user made it first

from ray.llm._internal.batch.stages.vllm_engine_stage import vLLMEngineStageUDF
from airflow_provider_raybatch.pipeline.generate import engine, engine_actor

os.environ[engine.FORKSERVER_ENV] = "0"
# Compile in this process: Inductor's default pool of compile workers starts interpreters that each
# import torch (seconds of CPU apiece) for one kernel. Where the header goes is decided the same way.
os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"

def build(self, *args, **kwargs):
    self.llm = type("Engine", (), {})()
vLLMEngineStageUDF.__init__ = build

engine_actor.RaybatchvLLMEngineStageUDF(
    data_column="__data", expected_input_keys=[], raybatch_staging=None,
    raybatch_compile_cache_dir=CACHE, model="never-loaded")

import torch

@torch.compile(backend="inductor")
def kernel(x):
    return torch.sin(x) * 2 + x.cos()

kernel(torch.randn(64))
used = sorted(os.path.relpath(os.path.join(folder, name), PLANTED)
              for folder, _, names in os.walk(PLANTED) for name in names)
print(json.dumps({"used": used}))
"""


@pytest.mark.timeout(300)
def test_a_cpu_kernel_compiled_in_the_replica_uses_nothing_under_torch_s_tmp_folder(tmp_path: Path) -> None:
    """With compile_cache_dir set and checked, the engine's compile must neither read nor write the
    /tmp folder another user made: here it puts its precompiled header there (and would compile one
    planted there into the kernel)."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    cache = tmp_path / "vllm-cache"
    code = f"SHARED = {str(shared)!r}\nCACHE = {str(cache)!r}\n{_COMPILE_IN_REPLICA}"

    report = run_in_ray_env(code)

    assert report["used"] == [], f"the engine's compile used {report['used']} under torchinductor_<user>"
