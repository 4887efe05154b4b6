"""A prefill's kernel sequence, prepared once per problem shape and run with one native call.

A `Program` holds, for every kernel of the call, where each argument comes from: a constant (sizes,
scale) or one of the call's pointers plus an offset (a tensor, or a region of the workspace). It
never holds a pointer of its own, so a program is built on the first call of a shape, shared by
every later call and every thread, and a call only packs its own pointers (`INPUTS` order) and
hands them to `kda_run` in the C shim, which forms the argument values and launches the whole
sequence (docs/call_path.md).

Arguments are matched to the kernels by the names the manifest lists, and a program refuses to be
built with a missing or unknown argument: the manifest is the one description of the kernel ABI.
"""

from __future__ import annotations

import struct
from typing import List, Mapping, Sequence, Tuple, Union

import numpy as np

from ..spec import prefill_args
from ..library.constants import MAX_SLOTS  # the shim's KDA_MAX_SLOTS, generated from it
from ..library.loader import KernelLibrary

# The per-call pointer vector, in this order (kda_run's `inputs`).
INPUTS = prefill_args.NAMES + ("workspace", "stream")
SLOT = {name: i for i, name in enumerate(INPUTS)}
N_INPUTS = len(INPUTS)
_PACK = struct.Struct(f"<{N_INPUTS}Q").pack

STEP_DTYPE = np.dtype([("kernel", "<i4"), ("first", "<i4"), ("count", "<i4"), ("reserved", "<i4")])
SLOT_DTYPE = np.dtype([("src", "<i4"), ("reserved", "<i4"), ("add", "<u8")])


class Ref:
    """An argument that is call input `name`'s pointer plus `offset` bytes."""

    __slots__ = ("src", "offset")

    def __init__(self, name: str, offset: int = 0):
        self.src = SLOT[name]
        self.offset = offset

    def __repr__(self) -> str:
        return f"Ref({INPUTS[self.src]}+{self.offset})"


def ws(offset: int) -> Ref:
    """A workspace region at `offset` bytes from the workspace's base."""
    return Ref("workspace", offset)


STREAM = Ref("stream")
NULL = None  # an absent optional pointer

Value = Union[Ref, int, float, None]


def pack_inputs(ptrs: Sequence[int]) -> bytes:
    """The call's pointers (INPUTS order, 0 for absent ones) as kda_run reads them."""
    return _PACK(*ptrs)


def _slot_value(kind: str, value: Value, where: str) -> Tuple[int, int]:
    """(src, add) of one argument slot; a constant keeps its bit pattern in the low bytes."""
    if kind in ("ptr", "stream"):
        if value is None:
            return -1, 0
        if not isinstance(value, Ref):
            raise TypeError(f"{where}: a pointer argument takes a Ref or None, got {value!r}")
        return value.src, value.offset
    if isinstance(value, Ref) or value is None:
        raise TypeError(f"{where}: a {kind} argument takes a constant, got {value!r}")
    if kind == "i32":
        if not -2 ** 31 <= int(value) < 2 ** 31:
            raise OverflowError(f"{where}: {value} does not fit int32")
        return -1, int(value) & 0xFFFFFFFF
    if kind == "i64":
        return -1, int(value) & 0xFFFFFFFFFFFFFFFF
    if kind == "f32":
        return -1, struct.unpack("<I", struct.pack("<f", float(value)))[0]
    raise TypeError(f"{where}: unknown argument kind {kind!r}")


class Program:
    """The steps of one call: immutable once built, shared across calls and threads."""

    def __init__(self, lib: KernelLibrary, device_id: int):
        self.lib = lib
        self.device_id = device_id
        self.names: List[str] = []
        self._steps: List[Tuple[int, int, int]] = []
        self._slots: List[Tuple[int, int]] = []
        self._frozen = False

    def add(self, kernel_name: str, args: Mapping[str, Value]) -> None:
        """Append a launch of `kernel_name`; `args` names every argument the manifest lists."""
        if self._frozen:
            raise RuntimeError("a Program is immutable once finished")
        kernel = self.lib.kernel(kernel_name)
        declared = [a["name"] for a in kernel.args]
        missing = [n for n in declared if n not in args]
        unknown = [n for n in args if n not in declared]
        if missing or unknown:
            raise TypeError(f"kernel {kernel_name}: arguments missing {missing}, unknown {unknown} "
                            f"(the manifest declares {declared})")
        first = len(self._slots)
        for spec in kernel.args:
            self._slots.append(_slot_value(spec["kind"], args[spec["name"]], f"{kernel_name}.{spec['name']}"))
        self._steps.append((kernel.index, first, len(declared)))
        self.names.append(kernel_name)

    def finish(self) -> "Program":
        if len(self._slots) > MAX_SLOTS:
            raise ValueError(f"a program takes at most {MAX_SLOTS} argument slots, got {len(self._slots)}")
        steps = np.zeros(max(1, len(self._steps)), STEP_DTYPE)
        for i, (kernel, first, count) in enumerate(self._steps):
            steps[i] = (kernel, first, count, 0)
        slots = np.zeros(max(1, len(self._slots)), SLOT_DTYPE)
        for i, (src, add) in enumerate(self._slots):
            slots[i] = (src, 0, add)
        self._steps_arr, self._slots_arr = steps, slots  # kept alive: kda_run reads them
        self._steps_ptr, self._slots_ptr = steps.ctypes.data, slots.ctypes.data
        self._n_steps, self._n_slots = len(self._steps), len(self._slots)
        self.lib.ensure_loaded(self.names, self.device_id)  # before any thread runs it; loading is serialised
        self._frozen = True
        return self

    def tables(self) -> Tuple[np.ndarray, np.ndarray]:
        """The steps and the slots as flat int32 and int64 arrays holding the rows kda_run reads
        (STEP_DTYPE, SLOT_DTYPE): the XLA handler takes them as the custom call's attributes."""
        if not self._frozen:
            raise RuntimeError("a Program has tables once finished")
        return (self._steps_arr[:self._n_steps].view(np.int32).reshape(-1).copy(),
                self._slots_arr[:self._n_slots].view(np.int64).reshape(-1).copy())

    def run(self, inputs: bytes) -> None:
        """Launch every step on the stream in `inputs` (pack_inputs), in one native call."""
        if not self._n_steps:
            return
        code = self.lib.run(self.device_id, self._steps_ptr, self._n_steps, self._slots_ptr, self._n_slots,
                            inputs, N_INPUTS)
        if code:
            self.lib.raise_run_error(code, self.names)

