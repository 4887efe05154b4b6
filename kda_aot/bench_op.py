"""`python -m kda_aot.bench_op`: the host cost of a call through the torch op against the direct call
(`--help` lists the options). The command only: the tool is kda_aot/tools/bench_op.py, outside the API."""

import sys

from .tools.bench_op import main

if __name__ == "__main__":
    sys.exit(main())
