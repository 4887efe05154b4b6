"""What the command-line tools (demo, bench, bench_op, profile) need before they can run, as one line each.

A tool that cannot run on this machine must say why in one sentence and exit non-zero, never end
in a traceback from deep inside torch or ctypes: a new user reads the first line, not the last.
"""

from __future__ import annotations

import sys
from typing import Optional

# Exit status of a tool that could not run here (argparse uses 2 for bad flags; the same "nothing
# was measured" meaning). A failed check (the demo's FAIL) exits 1, so scripts can tell them apart.
CANNOT_RUN = 2

# The torch release ci/venv.sh installs (TORCH_PIN there); named in the hint below.
TORCH_PIN = "torch==2.13.0"


def torch_problem() -> Optional[str]:
    """None when torch imports; else why not, with the command that installs it."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        # ImportError covers a missing torch and a broken one (a missing libcuda dependency, a
        # module set to None); the cause follows in parentheses.
        # The hint names the pinned install: a bare `pip install torch` downloads an unpinned,
        # multi-GB CUDA build, which ci/venv.sh warns against.
        return (f"torch is not importable ({exc}); install a CUDA build of torch into this environment "
                f"(on a GPU machine bash ci/demo.sh installs {TORCH_PIN} into .venv/)")
    return None


def library_problem() -> Optional[str]:
    """None when the kernel library loads; else the loader's reason (missing, mismatched...)."""
    import kda_aot

    info = kda_aot.info()
    if info.get("library") is None:
        return f"the kernel library did not load: {info.get('error', 'unknown reason')}"
    return None


def gpu_problem() -> Optional[str]:
    """None when torch and the library both see a Hopper GPU; else why not. Needs torch."""
    import torch

    import kda_aot

    problem = library_problem()
    if problem:
        return problem
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch (a Hopper GPU is needed)"
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        return f"the kernels are built for Hopper (sm_90a); this device is sm_{major}{minor}"
    info = kda_aot.info()
    if not info.get("devices"):
        return f"the kernel library sees no device: {info.get('device_error', 'unknown reason')}"
    return None


def cannot_run(prog: str, reason: str) -> int:
    """Print the one line (stderr: it is a diagnostic, not a result) and return the exit status."""
    print(f"{prog}: cannot run here: {reason}", file=sys.stderr, flush=True)
    return CANNOT_RUN
