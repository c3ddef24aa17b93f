# A Ray node that can run the shipped pipeline on NVIDIA GPUs: Ray Data + vLLM at versions that work
# together (ray 2.57's `llm` extra pins vllm 0.25.1). The provider itself is not needed here: each
# job ships the pipeline module in its runtime_env.
FROM rayproject/ray:2.57.0-py311-gpu
RUN pip install --no-cache-dir "ray[data,default,llm]==2.57.0" "vllm==0.25.1" pyarrow boto3
