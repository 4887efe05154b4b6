"""`python -m kda_aot`: what is installed here, whether it can run, and the commands that come with it.

Prints kda_aot.info() (version, CUDA flavour, kernel count, devices or why there are none), then in
one line whether the kernels can run here ("can run here: ..." or "cannot run here: ..."), and the
package's command-line tools. Needs neither torch nor a GPU; exits 0 either way.
"""

from __future__ import annotations

import sys

# The package's command-line tools, each with what it needs. Where one cannot run it says why in one
# line and exits with status 2 (kda_aot/tools/cli_checks.py), except the demo without a GPU, which runs
# its CPU reference instead.
COMMANDS = (
    ("python -m kda_aot.demo", "prefill on a default problem, checked against the references "
                               "(a CPU reference without a GPU)"),
    ("python -m kda_aot.bench", "GPU time per call against FlashKDA and FLA when importable (torch, Hopper GPU)"),
    ("python -m kda_aot.bench_op", "host cost of the torch operator paths (torch, Hopper GPU)"),
    ("python -m kda_aot.profile", "host cost and per-kernel device time of one call (torch, Hopper GPU)"),
)


def verdict(info: dict) -> str:
    """One line: whether prefill can run here, from info() and the devices' compute capability (the
    kernels are sm_90a machine code: Hopper only), and if not, why and what still runs."""
    anyway = "the CPU reference still runs: python -m kda_aot.demo"
    if info.get("library") is None:
        return f"cannot run here: the kernel library did not load ({info.get('error', 'unknown reason')})"
    if not info.get("devices"):
        why = info.get("device_error", "no CUDA device")
        why = "no NVIDIA driver" if why.startswith("no NVIDIA driver found") else "no usable CUDA device"
        return f"cannot run here: {why} (device_error above); the kernels need a Hopper GPU; {anyway}"
    from kda_aot.library.streams import compute_capability

    found = []
    for i in range(int(info["devices"])):
        try:
            found.append((i, compute_capability(i)))
        except Exception:  # noqa: BLE001 - a courtesy: the first call reports what really fails
            return f"can run here: {info['devices']} CUDA device(s), compute capability not readable"
    hopper = [f"cuda:{i}" for i, (major, _) in found if major == 9]
    if not hopper:
        seen = ", ".join(f"cuda:{i} is sm_{major}{minor}" for i, (major, minor) in found)
        return (f"cannot run here: no Hopper GPU ({seen}); the kernels are built for sm_90a (H100, H200, "
                f"H20) only; {anyway}")
    return f"can run here: on {', '.join(hopper)} (Hopper, sm_90)"


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if args:
        print(f"python -m kda_aot: takes no arguments (got {' '.join(args)}); the commands are listed below",
              file=sys.stderr)
    import kda_aot

    info = kda_aot.info()
    width = max(len(key) for key in info)
    print("kda_aot.info():")
    for key, value in info.items():
        print(f"  {key:<{width}}  {value}")
    print(verdict(info))
    print("commands:")
    width = max(len(cmd) for cmd, _ in COMMANDS)
    for cmd, what in COMMANDS:
        print(f"  {cmd:<{width}}  {what}")
    return 2 if args else 0


if __name__ == "__main__":
    sys.exit(main())
