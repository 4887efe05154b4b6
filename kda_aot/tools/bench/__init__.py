"""The benchmark behind `python -m kda_aot.bench` (docs/benchmarks.md), by part:

- cases.py: the suites, each input class on the device, the float64 gold and the error measure;
- runners.py: the calls it times, kda-aot's eager and graph modes and the peers (FLA, FlashKDA,
  cuDNN's engine);
- timing.py: CUDA-event medians, the copy bandwidth, host time per call;
- measure.py: one row of the table, and the host-cost rows under it;
- costs.py: the cost modes (--checkpoint-cost, --contract-cost, --state-io-cost, --sweep-cp);
- report.py: the run's metadata, JSON, PNG and table cells;
- cli.py: the command's arguments and main().

The names below are what the device scripts of ci/ and the tests use.
"""

from .cases import (CP_SUITE, GATE_CLASSES, GATE_FORMS, PEERS_SUITE, SUITES, UNEVEN6, class_cases, errors, floor_bytes,
                    gate_kwargs, gold_of, make_case, shape_key, to_device)
from .cli import main
from .report import write_json, write_png
from .runners import (FLASHKDA_EARLIER_RECIPE, capture, cudnn_runner, eager_runner, fla_runner,
                      flashkda_has_stable_inverse, forced_env, forced_k2_kernel, graph_runner)
from .timing import copy_bandwidth, host_us, host_us_each, time_ms

__all__ = ["CP_SUITE", "GATE_CLASSES", "GATE_FORMS", "PEERS_SUITE", "SUITES", "UNEVEN6", "class_cases", "errors",
           "floor_bytes", "gate_kwargs", "gold_of", "make_case", "shape_key", "to_device", "main", "write_json",
           "write_png", "FLASHKDA_EARLIER_RECIPE", "capture", "cudnn_runner", "eager_runner", "fla_runner",
           "flashkda_has_stable_inverse", "forced_env", "forced_k2_kernel", "graph_runner", "copy_bandwidth", "host_us",
           "host_us_each", "time_ms"]
