"""`python -m kda_aot`: what is installed here, whether it can run, and the commands that come with it.

Prints kda_aot.info() (version, CUDA flavour, kernel count, devices or why there are none) and the
package's command-line tools. Needs neither torch nor a GPU.
"""

from __future__ import annotations

import sys

# The package's command-line tools, each with what it needs; every one says in one line why it
# cannot run where it cannot (kda_aot/cli_checks.py) and exits with status 2.
COMMANDS = (
    ("python -m kda_aot.demo", "prefill on a default problem, checked against the references "
                               "(a CPU reference without a GPU)"),
    ("python -m kda_aot.bench", "GPU time per call against FlashKDA and FLA when importable (torch, Hopper GPU)"),
    ("python -m kda_aot.bench_op", "host cost of the torch operator paths (torch, Hopper GPU)"),
    ("python -m kda_aot.profile", "host cost and per-kernel device time of one call (torch, Hopper GPU)"),
)


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
    print("commands:")
    width = max(len(cmd) for cmd, _ in COMMANDS)
    for cmd, what in COMMANDS:
        print(f"  {cmd:<{width}}  {what}")
    return 2 if args else 0


if __name__ == "__main__":
    sys.exit(main())
