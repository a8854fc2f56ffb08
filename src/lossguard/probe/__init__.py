"""The fault zoo: a tiny model trained for real with DeepSpeed on CPU, with real faults injected.

`scenarios` (the registry) and `launch` import no torch; `model`, `faults` and `train_job` run inside the job.
See docs/zoo.md.
"""
