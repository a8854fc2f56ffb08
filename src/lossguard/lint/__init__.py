"""`lossguard lint`: check a DeepSpeed config, training arguments and package versions before a run.

Pure Python: no torch, no deepspeed (unless `--deepspeed-schema` or `--trust-pickle` asks for them).
Public API: `lossguard.lint.api.lint`, `lossguard.lint.api.load_config`, `lossguard.lint.rules.all_rules`,
`lossguard.lint.rules.get_rule`.
"""
