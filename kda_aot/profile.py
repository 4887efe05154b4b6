"""`python -m kda_aot.profile`: where one call's time goes: host overhead and per-kernel device time
(`--help` lists the options). The command only: the tool is kda_aot/tools/profile.py, outside the API."""

import sys

from .tools.profile import main

if __name__ == "__main__":
    sys.exit(main())
