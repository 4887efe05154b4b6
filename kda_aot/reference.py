"""Torch references for KDA prefill (docs/algorithm.md §2): the float64 gold and the chunked algorithm.

The algorithm is kda_aot/references/chunked.py (its docstring details each reference), written
once over an array backend; this module runs it on torch (kda_aot/references/backend_torch.py), on
the inputs' device (CPU or CUDA), and adds what only torch has: the kernels' approximations for
`approx=` (`KernelApprox`) and the m_seg workspace layout. reference_np.py runs the same algorithm
on NumPy.

* `gold_prefill`: the per-token delta-rule recurrence of §2.2 in float64 with exact functions
  (§5.3 item 1's accuracy target).
* `chunked_prefill(mode="exact")`: the CHUNK=16 algebra of §2.3 in float64 with no rounding.
* `chunked_prefill(mode="emulate")`: the §2.4 rounding recipe (P1-P8, Q1-Q7) at the §2.5 points;
  bitwise against the kernels with `approx=KernelApprox(lib)` on a GPU, ~1-2 bf16 ulps without.
* `chunked_prefill(mode="accurate")`: the recipe of numerics="accurate" (docs/numerics.md).

Inputs follow the low-level API (§1.1/§1.3): token-major [B, T, H, 128] tensors, beta logits
[B, T, H], V-first states [N, H, V, K], optional packed `cu_seqlens` (then B = 1).
"""

from __future__ import annotations

from functools import partial

import torch

from .library.constants import CHUNK, D, LOG2E  # noqa: F401  (public: the tests read them here)
from .references import backend_torch, chunked, inputs, rounding
from .references.chunked import bind
from .references.rounding import L2_EPS  # noqa: F401

gold_prefill = bind(backend_torch, chunked.gold_prefill)
chunked_prefill = bind(backend_torch, chunked.chunked_prefill)
gate_log_decay = bind(backend_torch, chunked.gate_log_decay)
beta_strength = bind(backend_torch, chunked.beta_strength)
rel_rmse = bind(backend_torch, inputs.rel_rmse)
make_inputs = bind(backend_torch, inputs.make_inputs)

# The algorithm's pieces on torch, for the tests that check one step of the recipe on its own
# (tests/cpu/test_reference.py) or against a kernel's workspace (tests/gpu/test_k1.py).
_ExactMath = partial(rounding.ExactMath, backend_torch)
_EmulateMath = partial(rounding.EmulateMath, backend_torch)  # (approx=None)
_AccurateMath = partial(rounding.AccurateMath, backend_torch)  # (approx=None)
_bf = backend_torch.bf
_fma32 = partial(rounding.fma32, backend_torch)
_fma32_rn = partial(rounding.fma32_rn, backend_torch)
_acc32 = partial(rounding.acc32, backend_torch)
# The exact fp32 stand-ins for the kernels' ex2.approx.ftz, tanh.approx and rsqrt.approx
_ex2, _tanh, _rsqrt = backend_torch.exp2, backend_torch.tanh, backend_torch.rsqrt
_inverse16 = chunked._inverse16
_prepare_tiles = chunked._prepare_tiles


class KernelApprox:
    """The kernels' PTX approximations (ex2.approx.ftz, tanh.approx, rsqrt.approx.ftz) run by the
    library's approx_* kernels, and fp32-accumulated tensor-core products, for the torch
    reference's `approx=` hook: with them the reference rounds exactly as the kernels do."""

    def __init__(self, lib):
        self.lib = lib

    def _run(self, name, x):
        x32 = x.float().contiguous()
        y = torch.empty_like(x32)
        if x32.numel():
            self.lib.kernel(name)(x32.data_ptr(), y.data_ptr(), x32.numel(),
                                  torch.cuda.current_stream().cuda_stream)
        return y

    def ex2(self, x):
        return self._run("approx_ex2", x)

    def tanh(self, x):
        return self._run("approx_tanh", x)

    def rsqrt(self, x):
        return self._run("approx_rsqrt", x)

    def mm(self, a, b):
        # The kernels multiply bf16 operands with fp32 accumulation; torch.bmm with out_dtype does
        # the same on tensor cores. Every product of the recipe has bf16-exact operands; fp16 is
        # kept for a caller whose operands are exact only there.
        def exact(t, dt):
            return torch.equal(t.to(dt).float(), t.float())

        dt = torch.bfloat16 if exact(a, torch.bfloat16) and exact(b, torch.bfloat16) else torch.float16
        batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        a3 = a.to(dt).expand(*batch, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
        b3 = b.to(dt).expand(*batch, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
        try:
            out = torch.bmm(a3, b3, out_dtype=torch.float32)
        except (TypeError, RuntimeError):
            # A torch without out_dtype: exact products summed in fp64, rounded once (the CPU
            # emulation's choice); a bitwise comparison then may miss a few ulps and fails.
            return (a.double() @ b.double()).float()
        return out.reshape(*batch, a.shape[-2], b.shape[-1])


# ------------------------------------------------------------------------------------------------
# Workspace layouts the tests need to read or write directly


def m_seg_swizzle(m: torch.Tensor) -> torch.Tensor:
    """[..., 128, 128] M_j matrices <-> the column-swizzled layout pre_scan writes and the merge reads
    (docs/kernel_abi.md): row r keeps column c at c ^ 8 (r & 3). XOR is its own inverse, so the same
    gather converts both ways."""
    r = torch.arange(D, device=m.device).unsqueeze(1)
    c = torch.arange(D, device=m.device).unsqueeze(0)
    idx = (c ^ (8 * (r & 3))).expand(*m.shape)
    return m.gather(-1, idx.contiguous())
