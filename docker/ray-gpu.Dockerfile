# A Ray node (head or GPU worker) that runs the shipped pipeline on NVIDIA GPUs: Ray Data + vLLM at
# versions that work together. Ray 2.57.0's `llm` extra pins vllm 0.25.1, which pins torch 2.11.0
# (a CUDA 13 build: the host's NVIDIA driver must support CUDA 13). This pair ran vLLM and
# ray.data.llm on an H100 for this project, and its vLLMEngineProcessorConfig has every field the
# pipeline sets. The provider is not installed: each job ships the pipeline in its runtime_env.
# Every node of one Ray cluster must run the same Ray and Python, so the head uses this image too.
#   docker build -f docker/ray-gpu.Dockerfile -t raybatch-ray-gpu:2.57.0 docker
FROM rayproject/ray:2.57.0-py311-gpu
# pyarrow and pydantic at the versions the resolver picks for ray[llm]==2.57.0 on Python 3.11;
# pinned so a rebuild cannot drift (the pipeline reads S3 with pyarrow and rebuilds the spec with pydantic).
RUN pip install --no-cache-dir \
        "ray[data,default,llm]==2.57.0" "vllm==0.25.1" "pyarrow==26.0.1" "pydantic==2.14.3"
