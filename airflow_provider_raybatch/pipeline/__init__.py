"""The batch pipeline that runs on the Ray cluster (``python -m airflow_provider_raybatch.pipeline``).

It is shipped with each job in the runtime_env's ``py_modules``; it needs Ray Data and vLLM on the
cluster but never Airflow. ``rows`` (file parsing) and ``prompts`` are pure functions; ``run`` wires
them into Ray Data and ``ray.data.llm``; ``sink`` stages result parts as blocks finish; ``commit``
resumes from staging and publishes a version with its HTML ``report``; ``progress`` prints progress
for the trigger; ``storage`` is the local-disk / S3 file layer, ``credentials`` the S3 settings
shipped with a job, ``models`` fetches s3:// models, ``images`` prepares images.
"""
