"""Public functions: `prefill` and `info`.

`prefill` is the validation wall's only door: every argument is read through DLPack, validated
(validation.py), and only then are outputs allocated and kernels launched. A bad argument never
reaches the GPU and never leaves an output partially written.
"""

from __future__ import annotations

import functools
import sys
import warnings
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from . import __version__, cp_plan, launcher, streams
from .loader import CudaError, KdaError, get_library, library_dir
from .tensors import TensorDesc, describe, describe_optional
from .validation import check_cu_seqlens_values, validate_prefill

D = 128


def prefill(q, k, v, g, beta, *, A_log, dt_bias, lower_bound: float = -5.0, scale: Optional[float] = None,
            initial_state=None, output_final_state: bool = False, cu_seqlens=None, cp="auto", out=None,
            final_state=None, stream=None, seq_lens: Optional[Sequence[int]] = None,
            value_split: Optional[int] = None) -> Tuple[Any, Any]:
    """KDA prefill (kda_spec.md): returns (o, final_state or None).

    q, k, v, g: bf16 [B, T, H, 128]; beta: bf16 logits [B, T, H]; A_log fp32 [H]; dt_bias fp32
    [H, 128] (or [H*128]); initial_state / final_state: [N, H, 128 (V), 128 (K)] bf16 or fp32.
    Packed varlen: B == 1 and cu_seqlens int32/int64 [N + 1]. `out` and `final_state` are written
    in place when given, else allocated with q's framework (torch or CuPy); with
    output_final_state=True and no buffer, the final state has initial_state's dtype (fp32
    without an initial state). `seq_lens`: optional host copy
    of the sequence lengths, which spares the device-to-host read of cu_seqlens. `stream`: a CUDA
    stream (handle, `__cuda_stream__` object or torch stream); default: torch's current stream
    for torch callers, else the legacy default stream. `cp`: intracard context parallelism
    (spec 4): "auto" splits long sequences when kda_aot.plan_prefill predicts a win, "off" never,
    "on" always (NotSplittableError when it cannot), an int forces that many segments per
    sequence (tests). `value_split` forces the K2 value-column
    split (1, 2 or 4; tests and benchmarks).
    """
    if final_state is not None and not output_final_state:
        raise ValueError("final_state: a buffer was given but output_final_state=False")
    t = {name: describe(obj, name) for name, obj in
         (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("A_log", A_log), ("dt_bias", dt_bias))}
    t.update(initial_state=describe_optional(initial_state, "initial_state"),
             cu_seqlens=describe_optional(cu_seqlens, "cu_seqlens"),
             out=describe_optional(out, "out"), final_state=describe_optional(final_state, "final_state"))
    args = (t["q"], t["k"], t["v"], t["g"], t["beta"], t["A_log"], t["dt_bias"], lower_bound, scale,
            t["initial_state"], t["final_state"], t["cu_seqlens"], t["out"], cp)
    problem = _validate(*args) if _hashable(lower_bound, scale, cp) else _validate.__wrapped__(*args)
    handle = streams.stream_handle(stream, problem.device_id)
    if problem.varlen:
        lengths = _check_host_lengths(t["cu_seqlens"], problem.T, seq_lens, handle)
    else:
        lengths = (problem.T,) * problem.B
    lib = get_library()
    sms = streams.sm_count(problem.device_id) if problem.N and problem.H else 1
    plan = _plan(problem, lengths, sms, handle, lib)
    if not launcher.serial_available(lib):
        raise NotImplementedError("this build of kda-aot has no K1/K2 kernels yet (see kda_aot.info())")

    if out is None:
        out = _empty_like(q, t["q"].shape, "bfloat16")
        t["out"] = describe(out, "out")
    if output_final_state and final_state is None:
        # One state dtype per call (the kernels keep a single state format): the allocated final
        # state follows initial_state's dtype, fp32 when there is none.
        problem = _with_final(problem)
        final_state = _empty_like(q, (problem.N, problem.H, D, D), problem.state_dtype)
        t["final_state"] = describe(final_state, "final_state")
    key = (args, t["out"], t["final_state"], plan, handle, value_split)
    program = _PROGRAMS.get(key)
    if program is None or not program.valid():
        if plan is not None and not plan.trivial:
            program = launcher.cp_program(lib, problem, t, handle, plan, sms, value_split=value_split)
        else:
            program = launcher.serial_program(lib, problem, t, handle, sms, value_split=value_split)
        if len(_PROGRAMS) >= 256:
            _PROGRAMS.pop(next(iter(_PROGRAMS)))
        _PROGRAMS[key] = program
    program.run()
    return out, (final_state if output_final_state else None)


# Launch programs of recent calls, keyed by everything they were built from (the validated
# descriptions, plan, stream): an identical call replays its program (launcher.Program).
_PROGRAMS: dict = {}


def _hashable(*values) -> bool:
    try:
        hash(values)
        return True
    except TypeError:
        return False


@functools.lru_cache(maxsize=256)
def _validate(q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, initial_state, final_state, cu_seqlens, out, cp):
    """validate_prefill, remembered: the wall is a pure function of the descriptions (pointers,
    shapes, strides, dtypes, devices) and scalars, and a steady-state caller repeats them."""
    return validate_prefill(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
                            scale=scale, initial_state=initial_state, final_state=final_state,
                            cu_seqlens=cu_seqlens, out=out, cp=cp)


@functools.lru_cache(maxsize=256)
def _plan_cached(lengths: tuple, n_heads: int, sms: int, mode) -> cp_plan.CPPlan:
    return cp_plan.plan_prefill(lengths, n_heads, sm_count=sms, mode=mode)


def _plan(problem, lengths, sms: int, stream: int, lib) -> Optional[cp_plan.CPPlan]:
    """The CP plan, or None for the serial path (cp="off", empty work, or no host lengths)."""
    if problem.cp == "off" or problem.N == 0 or problem.H == 0:
        return None
    if lengths is None:  # a packed batch captured into a CUDA graph without seq_lens
        if problem.cp == "auto":
            warnings.warn("kda_aot.prefill: cp='auto' runs serial here: cu_seqlens cannot be read back during "
                          "CUDA graph capture, so there are no host lengths to plan with; pass seq_lens= to "
                          "let the planner split long sequences", RuntimeWarning, stacklevel=3)
            return None
        raise ValueError(f"cp: {problem.cp!r} needs the sequence lengths on the host, and cu_seqlens cannot be "
                         "read back during CUDA graph capture; pass seq_lens=")
    plan = _plan_cached(lengths, problem.H, sms, problem.cp)
    if not plan.trivial and not launcher.cp_available(lib):
        if problem.cp == "auto":
            return None
        raise NotImplementedError("cp: this build has no context-parallel kernels (see kda_aot.info())")
    return plan


def _with_final(problem):
    import dataclasses

    state_dtype = problem.state_dtype or "float32"
    return dataclasses.replace(problem, has_final=True, state_dtype=state_dtype)


def _check_host_lengths(cu: TensorDesc, T: int, seq_lens: Optional[Sequence[int]], stream: int):
    """Check cu_seqlens' values on the host (spec 1.4), reading them back only when needed;
    returns the sequence lengths, or None when they cannot be had.

    A read-back is a device-to-host sync, which is illegal while the stream is being captured
    into a CUDA graph: then the values cannot be checked, the kernels clamp bad lengths, and
    cp="auto" runs serial (the planner needs host lengths).
    """
    if seq_lens is not None:
        lengths = tuple(int(x) for x in seq_lens)
        if len(lengths) != cu.shape[0] - 1:
            raise ValueError(f"seq_lens: expected {cu.shape[0] - 1} lengths (one per sequence), got {len(lengths)}")
        _check_lengths(lengths, T)
        return lengths
    if streams.is_capturing(stream):
        return None
    values = read_device_array(cu, stream).tolist()
    check_cu_seqlens_values(values, T)
    return tuple(b - a for a, b in zip(values[:-1], values[1:]))


@functools.lru_cache(maxsize=256)
def _check_lengths(lengths: tuple, T: int) -> None:
    check_cu_seqlens_values(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).tolist(), T)


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


def _empty_like(ref, shape, dtype: str):
    """An uninitialised device array from the framework that produced `ref` (no new imports)."""
    module = type(ref).__module__.split(".")[0]
    if module == "torch":
        torch = sys.modules["torch"]
        return torch.empty(shape, dtype=getattr(torch, dtype), device=ref.device)
    if module == "cupy":
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(ref.device.id):
            return cupy.empty(shape, dtype=np.dtype("float32") if dtype == "float32" else _ml_bf16())
    raise TypeError(f"out: inputs from {module} cannot be allocated here; pass out= (and final_state=)")


def _ml_bf16():
    import ml_dtypes

    return ml_dtypes.bfloat16


def info() -> dict:
    """Version, build manifest, library path and the CUDA devices found (or why none)."""
    result = {"version": __version__, "library_dir": str(library_dir())}
    try:
        lib = get_library()
    except (KdaError, OSError) as exc:
        result.update(library=None, error=str(exc))
        return result
    result.update(library=str(lib.path), manifest=lib.manifest, kernels=sorted(lib.kernels))
    try:
        result["devices"] = lib.device_count()
    except CudaError as exc:
        result["devices"] = 0
        result["device_error"] = str(exc)
    return result
