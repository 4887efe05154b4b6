"""A CPU harness for the call path: the real library's manifest, with loading and launching replaced
by a recorder, and hand-built device-tensor descriptions. What a call would launch (kernels and
every argument value) can then be checked on a machine without a GPU."""

from __future__ import annotations

import ctypes
import struct
from typing import Dict, List, Optional

import numpy as np

from kda_aot import api
from kda_aot.intake import arguments
from kda_aot.library import streams
from kda_aot.library.loader import get_library
from kda_aot.plan.program import INPUTS, N_INPUTS, SLOT_DTYPE, STEP_DTYPE
from kda_aot.intake.tensors import TensorDesc


class Launch:
    """One recorded kernel launch: its name and its argument values by manifest name."""

    def __init__(self, name: str, args: Dict[str, int]):
        self.name, self.args = name, args

    def __repr__(self) -> str:
        return f"Launch({self.name})"


class Recorder:
    def __init__(self, monkeypatch, sm_count: int = 132):
        self.lib = get_library()
        self.calls: List[List[Launch]] = []
        self.inputs: List[Dict[str, int]] = []
        monkeypatch.setattr(type(self.lib), "ensure_loaded", lambda lib, names, device_id: None)
        monkeypatch.setattr(type(self.lib), "run", self._run)
        monkeypatch.setattr(streams, "sm_count", lambda device_id: sm_count)
        monkeypatch.setattr(streams, "compute_capability", lambda device_id: (9, 0))
        monkeypatch.setattr(arguments, "stream_device", lambda handle: 0)  # every handle is a stream of cuda:0
        monkeypatch.setattr(arguments, "KNOWN_STREAMS", set())
        api.empty_cache()
        self._by_index = {k.index: k for k in self.lib.kernels.values()}

    def _run(self, device_id, steps_ptr, n_steps, slots_ptr, n_slots, inputs, n_inputs):
        assert n_inputs == N_INPUTS
        steps = np.frombuffer((ctypes.c_char * (n_steps * STEP_DTYPE.itemsize)).from_address(steps_ptr), STEP_DTYPE)
        slots = np.frombuffer((ctypes.c_char * (n_slots * SLOT_DTYPE.itemsize)).from_address(slots_ptr), SLOT_DTYPE)
        ptrs = struct.unpack(f"<{N_INPUTS}Q", inputs)
        launches = []
        for kernel, first, count, _ in steps.tolist():
            k = self._by_index[kernel]
            values = {}
            for j, spec in enumerate(k.args):
                src, _, add = slots[first + j].tolist()
                values[spec["name"]] = ((ptrs[src] if src >= 0 else 0) + add) & 0xFFFFFFFFFFFFFFFF
            launches.append(Launch(k.name, values))
        self.calls.append(launches)
        self.inputs.append(dict(zip(INPUTS, ptrs)))
        return 0

    @property
    def last(self) -> List[Launch]:
        return self.calls[-1]


_next = [1 << 32]


def device_buffer(name: str, shape, dtype: str, align: int = 512, device_id: int = 0,
                  ptr: Optional[int] = None) -> TensorDesc:
    """A description of a device tensor at a fresh address (never dereferenced)."""
    itemsize = {"bfloat16": 2, "float32": 4, "int32": 4, "int64": 8, "uint8": 1}[dtype]
    n = int(np.prod(shape)) if shape else 1
    if ptr is None:
        ptr = _next[0]
        _next[0] += -(-max(n * itemsize, 1) // align) * align + align
    strides, acc = [], 1
    for size in reversed(tuple(shape)):
        strides.append(acc)
        acc *= max(size, 1)
    return TensorDesc(name=name, ptr=ptr, shape=tuple(shape), strides=tuple(reversed(strides)), dtype=dtype,
                      device="cuda", device_id=device_id)


def problem_args(T=64, H=2, lens=None, state=None, cu_dtype="int32"):
    """Inputs of one call as descriptions: dense [1, T] or packed `lens`; outputs given."""
    N = 1 if lens is None else len(lens)
    if lens is not None:
        T = sum(lens)
    x = {name: device_buffer(name, (1, T, H, 128), "bfloat16") for name in ("q", "k", "v", "g")}
    x["beta"] = device_buffer("beta", (1, T, H), "bfloat16")
    x["A_log"] = device_buffer("A_log", (H,), "float32")
    x["dt_bias"] = device_buffer("dt_bias", (H, 128), "float32")
    x["out"] = device_buffer("out", (1, T, H, 128), "bfloat16")
    if lens is not None:
        x["cu_seqlens"] = device_buffer("cu_seqlens", (N + 1,), cu_dtype)
    if state is not None:
        x["initial_state"] = device_buffer("initial_state", (N, H, 128, 128), state)
        x["final_state"] = device_buffer("final_state", (N, H, 128, 128), state)
        x["output_final_state"] = True
    return x


def call(x: dict, **kwargs):
    args = dict(x, **kwargs)
    q, k, v, g, beta = (args.pop(n) for n in ("q", "k", "v", "g", "beta"))
    args.setdefault("stream", 7)
    return api.prefill(q, k, v, g, beta, **args)


def fresh(x: dict) -> dict:
    """The same problem at new addresses (a serving loop's fresh tensors)."""
    return {n: (device_buffer(d.name, d.shape, d.dtype) if isinstance(d, TensorDesc) else d) for n, d in x.items()}
