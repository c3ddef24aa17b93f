"""The batch pipeline that runs on the Ray cluster (``python -m airflow_provider_raybatch.pipeline``).

It is shipped with each job in the runtime_env's ``py_modules``; it needs Ray Data and vLLM on the
cluster but never Airflow. ``rows`` and ``prompts`` are pure functions; ``run`` wires them into
Ray Data and ``ray.data.llm``.
"""
