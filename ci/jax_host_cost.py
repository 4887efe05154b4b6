"""Host cost per call of kda_aot.jax.prefill under jax.jit, beside the eager calls (device diagnostic).

    python3 ci/jax_host_cost.py [--T 64] [--H 1] [--chain 16]

Prints microseconds per call, each the median of 7 batches of 100 calls on a small problem (so the
GPU is never the slower side), timed to the end of the batch's last call:
  - torch eager: kda_aot.prefill on torch tensors;
  - JAX eager (DLPack): kda_aot.prefill on JAX arrays;
  - jit, C handler: a jitted function holding one kda_aot.jax.prefill (the library's handler,
    build_kernels/shim/kda_xla.c), and per prefill in a jitted chain of --chain prefills;
  - jit, ctypes callback: the same two, with the custom call served instead by a Python function
    behind a ctypes pointer (the route NVIDIA Warp's JAX FFI takes), doing the handler's work in
    Python: read the call frame, patch the pointers, run the program with kda_run. It exists only
    here, to measure what that route costs against the C handler.
Needs JAX with its CUDA plugin, torch and a Hopper GPU.
"""

import argparse
import ctypes as C
import statistics
import struct
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import xla_ffi as ffi  # noqa: E402 - tests/xla_ffi.py: XLA's FFI structs as ctypes


def timed(fn, done, calls=100, repeats=7) -> float:
    fn()
    done()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            r = fn()
        done(r)
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


# ---------------------------------------------------------------------------------------------
# the ctypes-callback handler: the work of kda_xla.c in Python, over XLA's structs as ctypes

def ctypes_handler(lib):
    """The handler as a Python function behind a ctypes pointer."""
    device = C.c_int32(0)

    def handle(frame_ptr):
        frame = frame_ptr.contents
        if frame.ext and frame.ext.contents.type == ffi.METADATA_EXTENSION:  # API 0.1, no traits
            meta = C.cast(frame.ext, C.POINTER(ffi.MetadataExt)).contents.metadata.contents
            meta.api_version.major, meta.api_version.minor = 0, 1
            return None
        found = ffi.attributes(frame)
        steps, slots, inputs, buffers = found[b"steps"], found[b"slots"], found[b"inputs"], found[b"buffers"]
        n_inputs, ws_slot, ws_align, stream_slot = (C.c_int32 * 4).from_address(inputs.data)
        slot_of = (C.c_int32 * buffers.size).from_address(buffers.data)
        vector = [0] * n_inputs
        for i in range(frame.args.size + frame.rets.size):
            lst, j = (frame.args, i) if i < frame.args.size else (frame.rets, i - frame.args.size)
            slot = slot_of[i]
            if slot >= 0:
                ptr = lst.items[j].contents.data or 0
                vector[slot] = (ptr + ws_align - 1) & ~(ws_align - 1) if slot == ws_slot else ptr
        args = ffi.StreamArgs(C.sizeof(ffi.StreamArgs), None, frame.ctx, None)
        frame.api.contents.stream_get(C.byref(args))
        vector[stream_slot] = args.stream or 0
        lib._lib.kda_get_device(C.byref(device))
        code = lib.run(device.value, steps.data, steps.size // 4, slots.data, slots.size // 2,
                       struct.pack(f"<{n_inputs}Q", *vector), n_inputs)
        if code:
            raise RuntimeError(f"kda_run failed: {code}")
        return None

    return ffi.HANDLER(handle)


# ---------------------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=64)
    parser.add_argument("--H", type=int, default=1)
    parser.add_argument("--chain", type=int, default=16)
    a = parser.parse_args()

    import jax
    import ml_dtypes
    import torch

    import kda_aot
    import kda_aot.jax as kj
    from kda_aot.library.loader import get_library

    T, H = a.T, a.H
    rng = np.random.default_rng(0)
    host = [rng.standard_normal((1, T, H, 128), dtype=np.float32).astype(ml_dtypes.bfloat16) for _ in range(4)]
    host.append(rng.standard_normal((1, T, H), dtype=np.float32).astype(ml_dtypes.bfloat16))
    A_log, dt_bias = rng.uniform(size=H).astype(np.float32), rng.uniform(size=(H, 128)).astype(np.float32)
    dev = jax.local_devices(backend="cuda")[0]
    jx = [jax.device_put(x, dev) for x in host]
    jA, jd = jax.device_put(A_log, dev), jax.device_put(dt_bias, dev)
    tx = [torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).cuda() for x in host]
    tA, td = torch.from_numpy(A_log).cuda(), torch.from_numpy(dt_bias).cuda()

    def jax_done(r=None):
        (r if r is not None else jx)[0].block_until_ready()

    def torch_done(r=None):
        torch.cuda.synchronize()

    def jitted(n):
        @jax.jit
        def f(q, k, v, g, beta, A_log, dt_bias):
            o = q
            for _ in range(n):
                o, _ = kj.prefill(o, k, v, g, beta, A_log=A_log, dt_bias=dt_bias)
            return (o,)
        return lambda: f(*jx, jA, jd)

    rows = [("torch eager (kda_aot.prefill)", timed(lambda: kda_aot.prefill(*tx, A_log=tA, dt_bias=td), torch_done)),
            ("JAX eager, DLPack (kda_aot.prefill)", timed(lambda: kda_aot.prefill(*jx, A_log=jA, dt_bias=jd), jax_done))]
    one, chain = jitted(1), jitted(a.chain)
    rows.append(("jit, C handler: one prefill per jitted call", timed(one, jax_done)))
    rows.append((f"jit, C handler: per prefill in a chain of {a.chain}", timed(chain, jax_done) / a.chain))

    want = np.asarray(one()[0]).tobytes()
    # the same jitted calls, served by the ctypes callback
    handler = ctypes_handler(get_library())
    jax.ffi.register_ffi_target("kda_aot_prefill_ctypes", jax.ffi.pycapsule(C.cast(handler, C.c_void_p).value),
                                platform="CUDA", api_version=1)
    kj._register = lambda platform="CUDA": "kda_aot_prefill_ctypes"
    kj._prepared.cache_clear()
    one, chain = jitted(1), jitted(a.chain)
    if np.asarray(one()[0]).tobytes() != want:
        raise SystemExit("the ctypes callback's result differs from the C handler's")
    rows.append(("jit, ctypes callback: one prefill per jitted call", timed(one, jax_done)))
    rows.append((f"jit, ctypes callback: per prefill in a chain of {a.chain}", timed(chain, jax_done) / a.chain))

    print(f"host cost per call, T={T}, H={H} (JAX {jax.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}); median of 7 batches of 100 calls, each batch timed to its end")
    width = max(len(name) for name, _ in rows)
    for name, us in rows:
        print(f"  {name:<{width}}  {us:8.1f} us")


if __name__ == "__main__":
    main()
