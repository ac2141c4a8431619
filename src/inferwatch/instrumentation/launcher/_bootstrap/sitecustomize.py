"""Start-up hook of ``inferwatch run``: Python imports this module at start-up in the launched program.

The launcher puts this directory first on ``PYTHONPATH``, so this module shadows any ``sitecustomize`` the
program would have imported; it imports that one too (chaining), then hands over to
``inferwatch.instrumentation.launcher.autoinstrument``. Nothing here may break the program: a failure is
reported in one line on stderr and the program runs uninstrumented.
"""

import os
import sys


def _chain_to_shadowed_sitecustomize() -> None:
    """Import the ``sitecustomize`` this one shadows, if there is one, as Python would have."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    ours = sys.modules.pop(__name__)
    try:
        import sitecustomize  # noqa: F401  (the next one on the path)
    except ModuleNotFoundError as exc:
        if exc.name != "sitecustomize":
            raise
        sys.modules[__name__] = ours


def _start_instrumentation() -> None:
    try:
        from inferwatch.instrumentation.launcher.autoinstrument import bootstrap

        bootstrap()
    except Exception as exc:
        sys.stderr.write(f"inferwatch run: instrumentation disabled in {sys.executable}: {exc!r}\n")


try:
    _chain_to_shadowed_sitecustomize()
finally:
    _start_instrumentation()
