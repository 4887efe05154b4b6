"""A serving engine's prefill step on the GPU, the way vLLM's KDA layer drives one (two steps of
one scheduler, the second at its maxima, continuing sequences of the first).

What the engine has: scheduler maxima (max_num_batched_tokens, max_num_seqs); buffers sized once
for them (a workspace from flashkda_compat.get_workspace_size, the output, final states and
checkpoints, of which each step uses prefix slices); the layer's packed projection [T, W] from
which q, k, v, g and beta are column slices (row-strided views, never copied); a state pool
[S, H, 128, 128] fp32 with one slot per running sequence (slots padded apart, as a hybrid cache
lays them out); a has-initial-state mask (sequences without prior state start from zero); and
one checkpoint per sequence at the last block boundary before its end (none when that is 0),
kept in its own pool slot for prefix caching.

The step is run two ways, each compared bit for bit (serial: the same math) with the step done
by hand, per sequence on contiguous copies with explicit gathers and scatters:
  A. kda_aot.prefill(..., state_pool=, state_indices=, checkpoint_offsets=, checkpoint_slots=)
     after zeroing the slots of sequences without prior state;
  B. flashkda_compat.fwd with the gathered initial states (masked), final_state and
     checkpoint_state prefix slices, then a scatter of both into the pool.
"""


import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]
torch = pytest.importorskip("torch")

from state_buffers import poison as _poison, same_bits as _same_bits, is_poison as _is_poison  # noqa: E402

D = 128
H = 4
SCALE = D ** -0.5
LOWER_BOUND = -5.0
MAX_NUM_BATCHED_TOKENS = 8192
MAX_NUM_SEQS = 16
BLOCK = 256  # checkpoint granularity: a sequence's checkpoint is at its last multiple of BLOCK before its end
S = 40  # pool slots
SLOT_PAD = 3 * H * D  # elements between slots (another state of the same slot, in a hybrid cache)
HD = H * D
W = 4 * HD + 8  # q | k | v | g | beta (H columns) | padding: a token stride of whole 16-byte units








def _checkpoint_offset(L):
    return ((L - 1) // BLOCK) * BLOCK if L > 0 else 0


def _split(proj, T):
    """q, k, v, g [1, T, H, 128] and beta [1, T, H] as column views of the projection [T, W]."""
    views = [proj[:T, i * HD:(i + 1) * HD].unflatten(1, (H, D)).unsqueeze(0) for i in range(4)]
    views.append(proj[:T, 4 * HD:4 * HD + H].unsqueeze(0))
    return views


def _by_hand(inputs, params, lens, slots, has_initial, offsets, pool):
    """The step per sequence on contiguous copies: (out [1, T, H, 128], expected pool, final states,
    checkpoints (None where not written))."""
    import kda_aot

    A_log, dt_bias = params
    T = sum(lens)
    out = _poison(torch.empty((1, T, H, D), dtype=torch.bfloat16, device="cuda"))
    want = pool.clone()
    finals, checkpoints = [], []
    a = 0
    for n, L in enumerate(lens):
        init = pool[slots[n]].clone() if has_initial[n] else torch.zeros((H, D, D), device="cuda")

        def run(p):
            seq = [t[:, a:a + p].contiguous() for t in inputs]
            return kda_aot.prefill(*seq, A_log=A_log, dt_bias=dt_bias, lower_bound=LOWER_BOUND, scale=SCALE,
                                   cu_seqlens=torch.tensor([0, p], dtype=torch.int32, device="cuda"),
                                   initial_state=init[None].contiguous(), output_final_state=True, cp="off")

        o, fs = run(L)
        out[:, a:a + L] = o
        finals.append(fs[0])
        off = offsets[n]
        checkpoints.append(run(off)[1][0] if 0 < off < L else None)
        a += L
    for n in range(len(lens)):
        want[slots[n]] = finals[n]
    return out, want, finals, checkpoints


def _padded_pool(seed):
    slot = H * D * D
    storage = _poison(torch.empty(S * (slot + SLOT_PAD), dtype=torch.float32, device="cuda"))
    pool = storage.as_strided((S, H, D, D), (slot + SLOT_PAD, D * D, D, 1))
    gen = torch.Generator(device="cuda").manual_seed(seed)
    pool.copy_(0.1 * torch.randn((S, H, D, D), generator=gen, device="cuda"))
    return pool, storage


def _steps():
    """Two scheduler steps: lengths, state slots, has-initial-state mask; the second continues
    three sequences of the first (their slots, with prior state) and fills the maxima."""
    lens1 = [1000, 16, 2100, 333, 700]
    slots1 = [7, 3, 12, 25, 30]
    has1 = [False, True, True, False, True]
    lens2 = [4000, 1200, 1000, 512, 300, 200, 100, 77, 65, 48, 33, 16, 16, 15, 1]
    lens2.append(MAX_NUM_BATCHED_TOKENS - sum(lens2))
    ck1 = _checkpoint_slots(lens1, slots1, set())
    used = set(slots1) | {s for s in ck1 if s >= 0}
    new = [s for s in range(S) if s not in used][:len(lens2) - 3]
    slots2 = [12, 30, 7] + new
    has2 = [True] * 3 + [False] * len(new)
    ck2 = _checkpoint_slots(lens2, slots2, used)
    return [(lens1, slots1, has1, ck1), (lens2, slots2, has2, ck2)]


def _checkpoint_slots(lens, slots, avoid):
    """A free slot (not a state slot of this step, not in `avoid`) per written checkpoint, -1 elsewhere."""
    free = iter(s for s in range(S - 1, -1, -1) if s not in slots and s not in avoid)
    return [next(free) if _checkpoint_offset(L) > 0 else -1 for L in lens]


def test_vllm_prefill_step_pool_and_flashkda_fwd_equal_the_step_by_hand():
    import kda_aot
    from kda_aot import flashkda_compat as fk
    from kda_aot import reference

    # sized once, for the scheduler's maxima
    ws = torch.empty(fk.get_workspace_size(MAX_NUM_BATCHED_TOKENS, H, MAX_NUM_SEQS), dtype=torch.uint8,
                     device="cuda")
    proj_buf = torch.empty((MAX_NUM_BATCHED_TOKENS, W), dtype=torch.bfloat16, device="cuda")
    out_a = torch.empty((1, MAX_NUM_BATCHED_TOKENS, H, D), dtype=torch.bfloat16, device="cuda")
    out_b = torch.empty_like(out_a)
    final_buf = torch.empty((MAX_NUM_SEQS, H, D, D), dtype=torch.float32, device="cuda")
    ck_buf = torch.empty_like(final_buf)
    pool_a, storage_a = _padded_pool(seed=70)
    pool_b, _ = _padded_pool(seed=70)
    pool_h = pool_a.clone()  # the engine's pool stepped by hand
    params = None

    for step, (lens, slots, has_initial, ck_slots) in enumerate(_steps()):
        T, N = sum(lens), len(lens)
        assert T <= MAX_NUM_BATCHED_TOKENS and N <= MAX_NUM_SEQS
        x = reference.make_inputs(lens, H, seed=71 + step, device="cuda")
        if params is None:  # the layer's gate parameters, the same every step
            params = (x["A_log"], x["dt_bias"])
        A_log, dt_bias = params
        _poison(proj_buf)
        for i, name in enumerate(("q", "k", "v", "g")):
            proj_buf[:T, i * HD:(i + 1) * HD] = x[name].reshape(T, HD)
        proj_buf[:T, 4 * HD:4 * HD + H] = x["beta"].reshape(T, H)
        inputs = _split(proj_buf, T)
        assert all(not t.is_contiguous() for t in inputs) and inputs[0].stride(1) == W
        cu = x["cu_seqlens"]  # int32 query_start_loc, on the device only
        idx = torch.tensor(slots, dtype=torch.int32, device="cuda")
        has = torch.tensor(has_initial, dtype=torch.bool, device="cuda")
        offsets_l = [_checkpoint_offset(L) for L in lens]
        offsets = torch.tensor(offsets_l, dtype=torch.int32, device="cuda")
        ck_idx = torch.tensor(ck_slots, dtype=torch.int32, device="cuda")
        written = [n for n in range(N) if offsets_l[n] > 0]
        assert written and len(written) < N

        out_h, pool_want, finals, cks = _by_hand([t.clone() for t in inputs], params, lens, slots, has_initial,
                                                 offsets_l, pool_h)
        for n in written:
            pool_want[ck_slots[n]] = cks[n]

        # A: the pool in place, checkpoints straight into their slots
        for n in range(N):
            if not has_initial[n]:
                pool_a[slots[n]].zero_()
        kw_a = dict(A_log=A_log, dt_bias=dt_bias, lower_bound=LOWER_BOUND, scale=SCALE, cu_seqlens=cu,
                    state_pool=pool_a, state_indices=idx, checkpoint_offsets=offsets, checkpoint_slots=ck_idx,
                    cp="off")
        assert kda_aot.workspace_size(*inputs, **kw_a) <= ws.numel(), "the maxima's workspace is too small"
        _poison(out_a)
        o, none = kda_aot.prefill(*inputs, out=out_a[:, :T], workspace=ws, **kw_a)
        assert none is None and o.data_ptr() == out_a.data_ptr()
        assert torch.equal(out_a[:, :T], out_h), f"step {step}: output (state pool) differs from the step by hand"
        assert _is_poison(out_a[:, T:]), f"step {step}: written past the step's tokens"
        for s in range(S):
            assert _same_bits(pool_a[s], pool_want[s]), f"step {step}: pool slot {s} (state pool)"

        # B: FlashKDA's fwd with gathered states, then the scatter
        init = pool_b[idx.long()]  # the gather (a copy)
        init[~has] = 0
        _poison(out_b)
        _poison(final_buf)
        _poison(ck_buf)
        out, final, ck = out_b[:, :T], final_buf[:N], ck_buf[:N]
        assert kda_aot.workspace_size(*inputs, A_log=A_log, dt_bias=dt_bias, lower_bound=LOWER_BOUND, scale=SCALE,
                                      cu_seqlens=cu, initial_state=init, output_final_state=True, final_state=final,
                                      checkpoint_offsets=offsets, checkpoint_state=ck, cp="off") <= ws.numel()
        assert fk.fwd(*inputs, SCALE, out, A_log, dt_bias, LOWER_BOUND, initial_state=init, final_state=final,
                      cu_seqlens=cu, workspace=ws, checkpoint_state=ck, checkpoint_offsets=offsets) is None
        assert torch.equal(out, out_h), f"step {step}: output (fwd) differs from the step by hand"
        assert _is_poison(out_b[:, T:]) and _is_poison(final_buf[N:]) and _is_poison(ck_buf[N:])
        for n in range(N):
            assert _same_bits(final[n], finals[n]), f"step {step}: final state {n} (fwd)"
            if n in written:
                assert _same_bits(ck[n], cks[n]), f"step {step}: checkpoint {n} at {offsets_l[n]} (fwd)"
            else:
                assert _is_poison(ck[n]), f"step {step}: checkpoint {n} at {offsets_l[n]} was written (fwd)"
        pool_b[idx.long()] = final
        rows = torch.tensor(written, dtype=torch.long, device="cuda")
        pool_b[ck_idx.long()[rows]] = ck[rows]
        for s in range(S):
            assert _same_bits(pool_b[s], pool_want[s]), f"step {step}: pool slot {s} (fwd + scatter)"

        pool_h = pool_want

    # the padding between slots (the other state of each slot) was never written
    pad = storage_a.view(S, -1)[:, H * D * D:]
    assert _is_poison(pad), "the state pool's padding between slots was written"
