"""Cross-GPU context parallelism: one packed batch split by tokens over the ranks of a process group.

    import kda_aot.distributed as kd
    res = kd.prefill(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, seq_lens=lens,
                     token_offset=offset, initial_state=h0, output_final_state=True)
    res.o            # [1, T_local, H, 128] bf16: this rank's slice of the output
    res.final_state  # [len(res.final_seqs), H, 128, 128]: the sequences that end on this rank
    res.final_seqs   # range of their global sequence ids

docs/distributed.md has the algorithm, the cost model and the measurements. In short, per rank:
  1. the sequences that begin on this rank run as an ordinary prefill (kda_aot.prefill, its own
     intracard CP included) from their initial states: bit for bit the single-GPU result;
  2. a slice that lies inside one sequence computes its transfer (M, B) with K1 + pre_scan
     (kda_aot.plan.transfer), folded over its segments in fp32;
  3. one all-gather of every rank's carry, fp32 [2, H, 128, 128] plus a 16-byte header;
  4. the carries of the earlier ranks are chained in fp32 (no TF32) into the entry state of the
     piece this rank holds of a sequence that began earlier;
  5. that piece runs as a prefill from its entry state.

This module imports torch (like kda_aot.torch, it is opt-in: plain `import kda_aot` never imports
it) and needs torch.distributed only when a call runs, not to be imported. Backends: NCCL
exchanges device tensors; any other backend (gloo) exchanges host copies, which synchronises the
host with the stream.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, NamedTuple, Optional, Sequence, Tuple, Union

import torch

import kda_aot

from .library.constants import D
from .plan.dist_plan import RankWork, plan_rank, segment_starts, transfer_segments
from .plan.program import INPUTS, pack_inputs

STATE = D * D
HEADER = 4  # fp32 entries after M and B: [reset flag, 0, 0, 0] (16 bytes keep the payload aligned)


class DistributedPrefill(NamedTuple):
    o: Any  # [1, T_local, H, 128] bf16
    final_state: Any  # [len(final_seqs), H, 128, 128] in the state dtype, or None
    final_seqs: range  # global ids of the sequences whose final states this rank returns
    work: RankWork  # what this rank computed (kda_aot.plan.dist_plan)


def payload_floats(n_heads: int) -> int:
    """fp32 entries one rank sends: M [H, 128, 128], B [H, 128, 128], the header."""
    return 2 * n_heads * STATE + HEADER


# ---------------------------------------------------------------------------------------------
# the process group


class _Group(NamedTuple):
    rank: int
    size: int
    gather: Any  # gather(out [size * P], inp [P])


def _group(group) -> _Group:
    """A torch.distributed process group (None: the default one), or any object with rank(),
    size() and all_gather_into_tensor(out, inp) (tests drive the exchange with such a fake)."""
    import torch.distributed as dist

    if group is not None and not isinstance(group, dist.ProcessGroup):
        if not all(hasattr(group, a) for a in ("rank", "size", "all_gather_into_tensor")):
            raise TypeError(f"group: expected a torch.distributed ProcessGroup or None, got {type(group).__name__}")
        return _Group(int(group.rank()), int(group.size()), group.all_gather_into_tensor)
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("group: torch.distributed is not initialised (call torch.distributed.init_process_group)")
    gather_fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    device_tensors = "nccl" in str(dist.get_backend(group)).lower()

    def gather(out, inp):
        if device_tensors or not inp.is_cuda:
            gather_fn(out, inp, group=group)
        else:
            # gloo: exchange host copies (the copy waits for the stream: a synchronisation)
            host_out, host_in = torch.empty(out.shape, dtype=out.dtype), inp.cpu()
            try:
                gather_fn(host_out, host_in, group=group)
            except (RuntimeError, NotImplementedError):  # a gloo without all_gather_into_tensor
                dist.all_gather(list(host_out.chunk(dist.get_world_size(group))), host_in, group=group)
            out.copy_(host_out)

    return _Group(dist.get_rank(group), dist.get_world_size(group), gather)


def exchange(payload: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Step 3: every rank's payload (fp32 [P]), as [world_size, P] on the payload's device."""
    g = _group(group)
    return _exchange(payload, g)


def _exchange(payload: torch.Tensor, g: _Group) -> torch.Tensor:
    out = torch.empty(g.size * payload.numel(), dtype=payload.dtype, device=payload.device)
    g.gather(out, payload)
    return out.view(g.size, payload.numel())


# ---------------------------------------------------------------------------------------------
# carries: the algebra (docs/distributed.md)


@contextlib.contextmanager
def ieee_fp32_matmul() -> Iterator[None]:
    """CUDA fp32 matmuls in full fp32 (no TF32) inside, the caller's setting restored after."""
    m = torch.backends.cuda.matmul
    if hasattr(m, "fp32_precision"):
        old = m.fp32_precision
        m.fp32_precision = "ieee"
        try:
            yield
        finally:
            m.fp32_precision = old
    else:  # torch before fp32_precision
        old = m.allow_tf32
        m.allow_tf32 = False
        try:
            yield
        finally:
            m.allow_tf32 = old


def pack_payload(kind: str, n_heads: int, device: Union[str, torch.device], M: Optional[torch.Tensor] = None,
                 B: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One rank's carry as the flat fp32 payload: M, B, then the header (reset flag).

    reset: carry := B whatever came before (M is not read; zero); transfer: carry := carry M + B;
    identity: M = I, B = 0; end: a reset to 0, which no later rank uses."""
    p = torch.zeros(payload_floats(n_heads), dtype=torch.float32, device=device)
    HS = n_heads * STATE
    m, b = p[:HS].view(n_heads, D, D), p[HS:2 * HS].view(n_heads, D, D)
    if kind == "transfer":
        m.copy_(M)
        b.copy_(B)
    elif kind == "reset":
        b.copy_(B)
    elif kind == "identity":
        m.copy_(torch.eye(D, dtype=torch.float32, device=device).expand(n_heads, D, D))
    elif kind != "end":
        raise ValueError(f"kind: expected reset, transfer, identity or end, got {kind!r}")
    if kind in ("reset", "end"):
        p[2 * HS] = 1.0
    return p


def entry_state(gathered: torch.Tensor, rank: int, n_heads: int) -> torch.Tensor:
    """Step 4: the state entering `rank`'s slice for the sequence in progress there, fp32
    [H, 128, 128], from the earlier ranks' payloads (rows 0 .. rank - 1 of `gathered`). A reset
    replaces the carry (torch.where: a non-finite carry of an unrelated sequence cannot leak),
    a transfer maps it: carry M + B in fp32."""
    HS = n_heads * STATE
    carry = torch.zeros(n_heads, D, D, dtype=torch.float32, device=gathered.device)
    with ieee_fp32_matmul():
        for j in range(rank):
            row = gathered[j]
            M, B = row[:HS].view(n_heads, D, D), row[HS:2 * HS].view(n_heads, D, D)
            carry = torch.where(row[2 * HS] != 0, B, torch.baddbmm(B, carry, M))
    return carry


def fold_transfers(M: torch.Tensor, B: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Segments [S, H, 128, 128] in order -> the slice's (M, B): M = M_0 ... M_{S-1},
    B = (..(B_0 M_1 + B_1) M_2 ..) + B_{S-1}, in fp32 (no TF32)."""
    m, b = M[0], B[0]
    with ieee_fp32_matmul():
        for i in range(1, M.shape[0]):
            b = torch.baddbmm(B[i], b, M[i])
            m = torch.bmm(m, M[i])
    return m.contiguous(), b.contiguous()


def unswizzle(m_seg: torch.Tensor) -> torch.Tensor:
    """pre_scan's column-swizzled M (docs/kernel_abi.md: (r, c) at column c ^ 8 (r & 3)) -> plain."""
    r = torch.arange(D, device=m_seg.device).unsqueeze(1)
    c = torch.arange(D, device=m_seg.device).unsqueeze(0)
    return m_seg.gather(-1, (c ^ (8 * (r & 3))).expand(m_seg.shape).contiguous())


# ---------------------------------------------------------------------------------------------
# the local kernels


def _host_ints(values, device) -> torch.Tensor:
    """int32 device array of host-known values without a synchronisation: a pinned staging copy
    and a stream-ordered non-blocking upload (torch's host allocator keeps the staging block until
    the copy is done)."""
    host = torch.tensor(list(values), dtype=torch.int32)
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def _local_prefill(*args, **kwargs):
    """The single-GPU prefill every local piece runs on (a seam for the CPU tests)."""
    return kda_aot.prefill(*args, **kwargs)


def slice_transfer(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float = -5.0, scale: Optional[float] = None,
                   segments: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Step 2: (M, B) of the slice as the middle of one sequence, fp32 [H, 128, 128] each:
    S_end = S_start M + B. The slice is cut into segments pre-scanned at once (dist_plan.
    transfer_segments; `segments` forces about that many, for tests), then folded."""
    from .library import streams
    from .library.loader import get_library
    from .plan.transfer import transfer_program

    # the validation wall of a prefill on the same tensors (names the bad argument)
    kda_aot.workspace_size(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound, scale=scale,
                           cp="off")
    T, H = q.shape[1], q.shape[2]
    dev = q.get_device()
    lib = get_library()
    sms = streams.sm_count(dev)
    if segments is None:
        n_seg, per = transfer_segments(T, H, sms)
    else:
        n_seg, per = transfer_segments(T, 1, segments, min_tiles=1)
    prog = transfer_program(lib, dev, H, T, n_seg, D ** -0.5 if scale is None else float(scale), float(lower_bound),
                            sms)
    table = _host_ints(segment_starts(T, per, n_seg) + tuple(range(n_seg)), q.device)
    out = torch.empty(prog.out_floats, dtype=torch.float32, device=q.device)
    work = torch.empty(prog.workspace_bytes, dtype=torch.uint8, device=q.device)
    named = dict(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias, cu_seqlens=table, out=out,
                 workspace=work)
    # by name: the program reads its inputs by slot (program.INPUTS)
    ptrs = [named[name].data_ptr() if name in named else 0 for name in INPUTS[:-1]]
    ptrs.append(torch._C._cuda_getCurrentRawStream(dev))
    prog.program.run(pack_inputs(ptrs))
    seg = out.view(2, n_seg, H, D, D)
    return fold_transfers(unswizzle(seg[1]), seg[0])


# ---------------------------------------------------------------------------------------------
# the call


def _global_lengths(seq_lens, cu_seqlens) -> Tuple[int, ...]:
    if seq_lens is not None:
        return tuple(seq_lens)
    if cu_seqlens is None:
        raise ValueError("seq_lens: pass the global host lengths (seq_lens) or the global cu_seqlens")
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError("cu_seqlens: expected a 1-D tensor of N + 1 offsets")
    cu = cu_seqlens.tolist()  # the one read-back of this mode (a synchronisation); seq_lens avoids it
    if cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens: expected non-decreasing offsets from 0, got {cu}")
    return tuple(b - a for a, b in zip(cu, cu[1:]))


def prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *, A_log: torch.Tensor, dt_bias: torch.Tensor, token_offset: int,
            seq_lens: Optional[Sequence[int]] = None, cu_seqlens: Optional[torch.Tensor] = None, group: Any = None,
            lower_bound: float = -5.0, scale: Optional[float] = None, initial_state: Optional[torch.Tensor] = None,
            output_final_state: bool = False, cp: Union[str, int] = "auto",
            out: Optional[torch.Tensor] = None) -> DistributedPrefill:
    """KDA prefill of one packed batch (B = 1) whose tokens are split over the ranks of `group`.

    Every rank passes its slice q, k, v, g [1, T_local, H, 128] and beta [1, T_local, H] (torch,
    on its CUDA device), the slice's start `token_offset` in the batch (rank r's slice follows rank
    r - 1's; rank 0 starts at 0, the last rank ends at the batch's end), and the whole batch's
    lengths: `seq_lens` (host ints, no synchronisation) or the global `cu_seqlens` (read back once:
    a synchronisation). A_log, dt_bias and `initial_state` ([N, H, 128, 128] bf16 or fp32, N the
    global sequence count) are the whole batch's, on every rank. `cp` is kda_aot.prefill's, for the
    local work. `out` ([1, T_local, H, 128] bf16) is written in place when given. Returns
    DistributedPrefill(o, final_state, final_seqs, work): final_state holds the
    final states of the sequences that end on this rank (ids final_seqs), in the initial state's
    dtype (fp32 without one), when output_final_state; else None.
    """
    grp = _group(group)
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or q.shape[0] != 1:
        raise ValueError(f"q: expected a torch tensor [1, T_local, H, 128], got "
                         f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
    lens = _global_lengths(seq_lens, cu_seqlens)
    T, H = q.shape[1], q.shape[2]
    work = plan_rank(lens, token_offset, T, grp.rank, grp.size)
    N = len(lens)
    if initial_state is not None and (not isinstance(initial_state, torch.Tensor)
                                      or tuple(initial_state.shape) != (N, H, D, D)):
        raise ValueError(f"initial_state: expected the whole batch's [N={N}, H={H}, {D}, {D}], got "
                         f"{tuple(getattr(initial_state, 'shape', ()))}")
    state_dtype = initial_state.dtype if initial_state is not None else torch.float32
    common = dict(A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound, scale=scale, cp=cp)
    h = work.head_len
    if out is not None and (not isinstance(out, torch.Tensor) or tuple(out.shape) != (1, T, H, D)):
        raise ValueError(f"out: expected [1, {T}, {H}, {D}] like q, got {tuple(getattr(out, 'shape', ()))}")
    o = q.new_empty((1, T, H, D)) if out is None else out

    # 1. the sequences that begin here, from their own initial states
    n_rest = len(work.rest_lens)
    keep_finals = output_final_state or work.tail_continues
    finals = None
    if keep_finals and (n_rest or work.head_ends):
        finals = q.new_empty((int(work.head_ends) + n_rest, H, D, D), dtype=state_dtype)
    if n_rest:
        cu_local = [0]
        for x in work.rest_lens:
            cu_local.append(cu_local[-1] + x)
        init = None if initial_state is None else initial_state[work.rest_first:work.rest_first + n_rest]
        _local_prefill(q[:, h:], k[:, h:], v[:, h:], g[:, h:], beta[:, h:], **common, initial_state=init,
                        cu_seqlens=_host_ints(cu_local, q.device), seq_lens=work.rest_lens, out=o[:, h:],
                        output_final_state=keep_finals,
                        final_state=finals[int(work.head_ends):] if keep_finals else None)

    # 2. this rank's carry
    if work.kind == "transfer":
        M, B = slice_transfer(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound, scale=scale)
        payload = pack_payload("transfer", H, q.device, M, B)
    elif work.kind == "reset":
        payload = pack_payload("reset", H, q.device, B=finals[-1].float())
    else:
        payload = pack_payload(work.kind, H, q.device)

    # 3. one collective
    gathered = _exchange(payload, grp)

    # 4. + 5. the piece of a sequence that began earlier, from its entry state
    if work.has_head:
        entry = entry_state(gathered, grp.rank, H)[None]
        want_final = output_final_state and work.head_ends
        # one packed sequence (not dense [1, h]): the same kernels, with the varlen CP tables
        _, fs = _local_prefill(q[:, :h], k[:, :h], v[:, :h], g[:, :h], beta[:, :h], **common, initial_state=entry,
                                cu_seqlens=_host_ints((0, h), q.device), seq_lens=(h,),
                                output_final_state=want_final, out=o[:, :h])
        if want_final:
            finals[0].copy_(fs[0])  # fp32 holding a bf16 state (docs/algorithm.md §3.4): exact in bf16 too

    n_fin = work.final_count
    final_state = finals[:n_fin] if output_final_state and finals is not None else None
    if output_final_state and final_state is None:
        final_state = q.new_empty((0, H, D, D), dtype=state_dtype)
    return DistributedPrefill(o, final_state, range(work.final_first, work.final_first + n_fin) if n_fin else range(0),
                              work)
