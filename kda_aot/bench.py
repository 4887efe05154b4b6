"""`python -m kda_aot.bench`: the benchmark, kda_aot.prefill against the memory floor and the Hopper peers
(`--help` lists the options). The command only: the tool is kda_aot/tools/bench/, outside the API."""

import sys

from .tools.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
