"""lossguard auto-attach: put this directory on a job's PYTHONPATH to guard it without code changes.

Python imports the first `sitecustomize` it finds on `sys.path` at start-up. This one first runs the
`sitecustomize` it shadows (a site or venv one, if any), then installs lossguard's import hook
(`lossguard.monitor.autoattach`), which wraps `deepspeed.initialize` and `transformers.Trainer.__init__`
when the job imports them. Nothing here may break the job: every failure is one line on stderr.
"""


def _chain_shadowed() -> None:
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_lossguard_chained_sitecustomize"] = module
    spec.loader.exec_module(module)


def _install() -> None:
    import os
    import sys

    try:
        _chain_shadowed()
    except Exception as exc:  # the shadowed sitecustomize failing is its own business: report, go on
        sys.stderr.write(f"lossguard auto-attach: the chained sitecustomize failed: {type(exc).__name__}: {exc}\n")
    if os.environ.get("LOSSGUARD_AUTOATTACH", "1") == "0":
        return
    try:
        from lossguard.monitor import autoattach

        autoattach.install()
    except Exception as exc:
        sys.stderr.write(f"lossguard auto-attach: not installed: {type(exc).__name__}: {exc}\n")


_install()
