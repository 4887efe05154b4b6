"""prefill's arguments as the runtime reads them, before the wall: one pass over torch tensors
(signature and pointers), else the DLPack descriptions of every argument; the call's stream, checked
once per (handle, device); the host hints of the sequence lengths and state indices; and, with
validate="host", the read-backs of cu_seqlens and state_indices.

Nothing here decides whether a call is valid: the wall (validation.py) does, on the descriptions.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

import numpy as np

from ..errors import KdaError
from ..library import streams
from ..spec import prefill_args
from . import frameworks
from .stream_check import check_stream_handle, stream_device
from .tensors import TensorDesc, describe
from .validation import _host_entries, check_cu_seqlens_values, hint_lengths, int_entries

TENSOR_ARGS = prefill_args.NAMES + ("workspace",)  # the order of `tensors` in prefill and workspace_size (api.py)
VALIDATE_MODES = ("device", "host")
_CU_SEQLENS, _FINAL_STATE, _STATE_POOL, _STATE_INDICES, _SEGMENT_IDS = (
    TENSOR_ARGS.index(n) for n in ("cu_seqlens", "final_state", "state_pool", "state_indices", "segment_ids"))


def intake(tensors: tuple, stream, output_final_state, validate, seq_lens, cu_seqlens_cpu,
           state_indices_cpu) -> tuple:
    """Everything prefill reads before the wall, in one pass: the options that go together, then
    read's (torch, signature, pointers, descriptions, handle) and the host hint of the lengths
    (host_hints), as (torch, signature, pointers, descriptions, handle, hint). A torch state
    pool's slot stride joins the signature (a torch signature holds contiguity, not strides, and a
    pool's slots may be padded apart)."""
    state_pool = tensors[_STATE_POOL]
    if tensors[_FINAL_STATE] is not None and not output_final_state:
        raise ValueError("final_state: a buffer was given but output_final_state=False")
    if state_pool is not None:
        check_pool_options(state_pool, output_final_state)
    if validate not in VALIDATE_MODES:
        raise ValueError(f"validate: expected 'device' or 'host', got {validate!r}")
    torch, sig, ptrs, descs, handle = read(tensors, stream)
    if seq_lens is None and cu_seqlens_cpu is None and state_indices_cpu is None and validate == "device":
        hint = None  # the common serving call: no hint to read (saves a call on the per-call path)
    else:
        hint = host_hints(torch, tensors, stream, handle, seq_lens, cu_seqlens_cpu, state_indices_cpu, validate)
    if torch is not None and state_pool is not None:
        sig = (sig, state_pool.stride())
    return torch, sig, ptrs, descs, handle, hint


def check_pool_options(state_pool, output_final_state) -> None:
    if state_pool is not None and output_final_state:
        raise ValueError("state_pool: cannot be combined with output_final_state; the final states are written "
                         "back into the pool at state_indices")


def read(tensors: tuple, stream) -> tuple:
    """(torch, signature, pointers, descriptions, handle) of a call's tensors, in TENSOR_ARGS order.

    torch tensors (torch imported and every argument a torch tensor or None): one pass reads the
    signature and the pointers; torch is the module, descriptions and handle are None (the stream is
    torch's, found once the plan knows the device). Anyone else: the call's stream first (the DLPack
    reads order the producers' writes before it), then every argument's DLPack description; torch is
    None."""
    torch = sys.modules.get("torch")
    intake = None if torch is None else torch_intake(torch.Tensor, tensors)
    if intake is not None:
        sig, ptrs = intake
        return torch, sig, ptrs, None, None
    handle = intake_stream(tensors[0], stream)
    descs = describe_all(tensors, frameworks.consumer_stream(handle))
    sig = tuple(None if d is None else (d.shape, d.strides, d.dtype, d.device, d.device_id,
                                        getattr(d, "readonly", False)) for d in descs)
    ptrs = [0 if d is None else d.ptr for d in descs]
    return None, sig, ptrs, descs, handle


def host_hints(torch, tensors: tuple, stream, handle, seq_lens, cu_seqlens_cpu, state_indices_cpu,
               validate: str):
    """The host hint of the sequence lengths as a plan key (hint_key), with state_indices_cpu
    checked; validate="host" reads cu_seqlens (planning with it), state_indices and segment_ids back."""
    hint = hint_key(seq_lens, cu_seqlens_cpu)
    state_pool, state_indices = tensors[_STATE_POOL], tensors[_STATE_INDICES]
    if state_indices_cpu is not None:
        check_indices_hint(state_indices_cpu, state_indices, state_pool)
    if validate == "host":
        hint = read_back_hint(torch, tensors, hint, stream, handle)
        if state_indices is not None and state_pool is not None:
            read_back_indices(torch, state_indices, state_pool, stream)
        if tensors[_SEGMENT_IDS] is not None:
            read_back_segment_ids(torch, tensors, stream)
    return hint


def describe_all(tensors, stream: int = -1) -> list:
    """Every argument's DLPack description (None for an absent one), in TENSOR_ARGS order;
    `stream` is the DLPack consumer stream (tensors.describe)."""
    descs = []
    for name, t in zip(TENSOR_ARGS, tensors):
        if t is not None:
            frameworks.check_argument(t, name)
        descs.append(None if t is None else describe(t, name, stream))
    return descs


def intake_stream(q, stream) -> Optional[int]:
    """The call's stream for a caller that is not torch, known before the DLPack reads (they order
    the producers' writes before it); None when q is not device memory (the wall refuses it)."""
    frameworks.check_argument(q, "q")
    device_id = frameworks.cuda_device(q)
    if device_id is None:
        return None
    return call_stream(None, stream, device_id, frameworks.default_stream(q, device_id))


def torch_intake(Tensor, tensors):
    """(signature, pointers) of torch tensors in one pass, or None when an argument is not a torch
    tensor (the DLPack intake then reads every argument). The signature is everything the wall
    checks of a tensor except its address: dtype, shape, layout (True for a contiguous tensor, else
    its strides: strided views plan with their strides), device, and the neg bit (a neg view's
    memory holds the un-negated values), a tuple per argument, None for an absent one. Each
    attribute read costs 50-90 ns on a serving host, so the strides are read only for a tensor that
    is not contiguous; a plain torch.Tensor skips isinstance (a tuple per tensor and the type test
    measured 0.4 us a call below one flat list, ci/host_path_cpu.py, 12 tensors)."""
    sig, ptrs = [], []
    for t in tensors:
        if t is None:
            sig.append(None)
            ptrs.append(0)
        elif type(t) is Tensor or isinstance(t, Tensor):
            sig.append((t.dtype, t.shape, t.is_contiguous() or t.stride(), t.get_device(), t.is_neg()))
            ptrs.append(t.data_ptr())
        else:
            return None
    return tuple(sig), ptrs


def hint_key(seq_lens, cu_seqlens_cpu):
    """The host hint as a hashable key: ("lens", ...) or ("cu", ...), or None. Its values are
    checked against the problem when a plan is built; every entry must be a Python int here so
    that 1.0 or True can never hit a plan built for 1."""
    if seq_lens is not None and cu_seqlens_cpu is not None:
        raise ValueError("seq_lens: pass either seq_lens or cu_seqlens_cpu, not both")
    if seq_lens is not None:
        return ("lens", int_tuple(_host_entries(seq_lens, "seq_lens"), "seq_lens"))
    if cu_seqlens_cpu is not None:
        return ("cu", int_tuple(_host_entries(cu_seqlens_cpu, "cu_seqlens_cpu"), "cu_seqlens_cpu"))
    return None


def int_tuple(items: list, name: str) -> tuple:
    """The entries (a list from validation._host_entries) as a tuple of Python ints: as they are
    when they already are (the common case, one type check each), else through int_entries, which
    takes numpy integers and refuses bools and floats naming the entry."""
    for item in items:
        if type(item) is not int:
            return tuple(int_entries(items, name))
    return tuple(items)


def read_back_hint(torch, tensors, hint, stream, handle):
    """validate="host": copy cu_seqlens back (a synchronisation), check it, and plan with it.
    `handle`: the call's stream when the caller is not torch (None: q is not device memory)."""
    cu_obj, q_obj = tensors[_CU_SEQLENS], tensors[0]
    if cu_obj is None:
        return hint
    cu = describe(cu_obj, "cu_seqlens", frameworks.consumer_stream(handle))
    if cu.device != "cuda" or len(cu.shape) != 1 or cu.dtype not in ("int32", "int64"):
        return hint  # the wall refuses it, naming it
    q = describe(q_obj, "q", frameworks.consumer_stream(handle))
    if torch is not None or handle is None:
        handle = call_stream(torch, stream, cu.device_id)
    if streams.is_capturing(handle):
        raise RuntimeError("validate: 'host' reads cu_seqlens back, which cannot happen while the stream is being "
                           "captured into a CUDA graph; use validate='device' there")
    values = read_device_array(cu, handle).tolist()
    T = q.shape[1] if len(q.shape) == 4 else 0
    check_cu_seqlens_values(values, T)
    read = ("cu", tuple(int(x) for x in values))
    if hint is not None and hint_lengths(hint, len(values) - 1, T) != hint_lengths(read, len(values) - 1, T):
        raise ValueError(f"{'seq_lens' if hint[0] == 'lens' else 'cu_seqlens_cpu'}: does not match cu_seqlens "
                         "read back from the device")
    return read


def read_back_indices(torch, state_indices, state_pool, stream) -> None:
    """validate="host" with a state pool: copy state_indices back (a synchronisation) and refuse
    an index past the pool or a slot used by two sequences (their reads and writes would race)."""
    idx = describe(state_indices, "state_indices")
    pool = describe(state_pool, "state_pool")
    if idx.device != "cuda" or len(idx.shape) != 1 or idx.dtype != "int32" or len(pool.shape) != 4:
        return  # the wall refuses it, naming it
    check_state_indices_host(_read_back(torch, stream, idx), pool.shape[0])


def read_back_segment_ids(torch, tensors, stream) -> None:
    """validate="host" with segment_ids: copy it back (a synchronisation) and refuse an entry outside
    [0, N) or one listed twice (the device would skip the one and run the other once)."""
    ids = describe(tensors[_SEGMENT_IDS], "segment_ids")
    q = describe(tensors[0], "q")
    cu = tensors[_CU_SEQLENS]
    if ids.device != "cuda" or len(ids.shape) != 1 or ids.dtype != "int32" or len(q.shape) != 4:
        return  # the wall refuses it, naming it
    n_seq = q.shape[0] if cu is None else leading_dim(cu, "cu_seqlens") - 1
    check_segment_ids_host(_read_back(torch, stream, ids), n_seq)


def _read_back(torch, stream, desc: TensorDesc) -> list:
    """validate="host": a small int32 device array's values, copied back on the call's stream (a
    synchronisation), refused while that stream is being captured into a CUDA graph."""
    handle = call_stream(torch, stream, desc.device_id)
    if streams.is_capturing(handle):
        raise RuntimeError(f"validate: 'host' reads {desc.name} back, which cannot happen while the stream is "
                           "being captured into a CUDA graph; use validate='device' there")
    return read_device_array(desc, handle).tolist()


def check_segment_ids_host(values: Sequence[int], n_seq: int) -> None:
    """Host copy of segment_ids: each entry in [0, n_seq), none twice."""
    seen = {}
    for i, x in enumerate(int_entries(values, "segment_ids")):
        if not 0 <= x < n_seq:
            raise ValueError(f"segment_ids: entry {i} = {x} is not a sequence index in [0, {n_seq})")
        if x in seen:
            raise ValueError(f"segment_ids: sequence {x} appears at entries {seen[x]} and {i}; list each sequence "
                             "once")
        seen[x] = i


def check_indices_hint(values, state_indices, state_pool) -> None:
    """state_indices_cpu: the caller's host copy of state_indices, checked like a read-back one
    (no synchronisation; like seq_lens, it must match the device tensor)."""
    if state_pool is None or state_indices is None:
        raise ValueError("state_indices_cpu: a host copy of state_indices, given without state_pool / state_indices")
    entries = _host_entries(values, "state_indices_cpu")
    n = leading_dim(state_indices, "state_indices")
    if len(entries) != n:
        raise ValueError(f"state_indices_cpu: expected {n} entries like state_indices, got {len(entries)}")
    check_state_indices_host(entries, leading_dim(state_pool, "state_pool"))


def leading_dim(obj, name: str) -> int:
    shape = getattr(obj, "shape", None)  # torch, CuPy, JAX, TensorDesc; else its DLPack description
    if shape is None:
        shape = describe(obj, name).shape
    if len(shape) < 1:
        raise ValueError(f"{name}: expected at least one dimension, got shape {tuple(shape)}")
    return int(shape[0])


def check_state_indices_host(values: Sequence[int], n_slots: int) -> None:
    """Host copy of state_indices: each entry < n_slots, no non-negative slot twice (negative
    entries are PAD_SLOT_ID-style "no state" and may repeat)."""
    seen = {}
    for i, x in enumerate(int_entries(values, "state_indices")):
        if x >= n_slots:
            raise ValueError(f"state_indices: entry {i} = {x} is past the pool's {n_slots} slots")
        if x >= 0:
            if x in seen:
                raise ValueError(f"state_indices: slot {x} appears at entries {seen[x]} and {i}; every sequence "
                                 "needs its own slot (two sequences on one slot would race in place)")
            seen[x] = i


def read_device_array(desc: TensorDesc, stream: int) -> np.ndarray:
    """Copy a small device array to the host, ordered after the work already on `stream`."""
    from cuda.bindings import driver

    host = np.empty(desc.shape, dtype=np.dtype(desc.dtype))
    if host.nbytes:
        (err,) = driver.cuMemcpyDtoHAsync(host.ctypes.data, desc.ptr, host.nbytes, driver.CUstream(stream))
        if err == driver.CUresult.CUDA_SUCCESS:
            (err,) = driver.cuStreamSynchronize(driver.CUstream(stream))
        if err != driver.CUresult.CUDA_SUCCESS:
            raise KdaError(f"{desc.name}: reading it back to the host failed: {err}")
    return host


def call_stream(torch, stream, device_id: int, default: Optional[int] = None) -> int:
    if stream is None and torch is not None:
        return torch._C._cuda_getCurrentRawStream(device_id)  # 0.3 us; torch.cuda.current_stream() is 4
    handle = default if stream is None and default is not None else streams.stream_handle(stream, device_id)
    if (handle, device_id) not in KNOWN_STREAMS:
        # A raw handle would reach the launch unchecked: ask the driver once per (handle, device).
        # A handle destroyed and reused by a new stream keeps its entry: it is then valid again.
        check_stream_handle(handle, device_id, stream_device)
        if len(KNOWN_STREAMS) >= 1024:
            KNOWN_STREAMS.clear()
        KNOWN_STREAMS.add((handle, device_id))
    return handle


KNOWN_STREAMS: set = set()
