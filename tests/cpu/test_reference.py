"""CPU tests of kda_aot.reference (docs/algorithm.md §2.2-2.5, §6): gold vs chunked, rounding emulation,
varlen/padding/isolation semantics. Small H and T so the file runs in well under a minute."""

from fractions import Fraction

import numpy as np
import pytest

# reference.py is the torch reference the GPU tests and the demo's GPU checks use; the CPU tests of
# the NumPy references (tests/cpu/test_reference_np.py) run without torch.
torch = pytest.importorskip("torch", reason="torch is not installed (tests of the torch reference, reference.py)")

from kda_aot import reference as R
from kda_aot.reference import chunked_prefill, gold_prefill, make_inputs, rel_rmse

EXACT_TOL = 1e-10  # chunked float64 algebra vs per-token float64 recurrence
EMU_TOL = 1e-2  # §2.4 emulation vs float64 gold
VARLEN = [1, 15, 16, 17, 0, 40]  # T=1, partial tiles on both sides of 16, an empty sequence
CASES = {"dense": (1, 77), "batch2": (2, 33), "varlen": VARLEN}
MODES = ("gold", "exact", "emulate")


def _run(mode, inp):
    if mode == "gold":
        return gold_prefill(**inp)
    return chunked_prefill(**inp, mode=mode)


def _inputs(case, state, lb=-5.0, H=2, seed=0):
    inp = make_inputs(CASES[case], H, seed, state=state)
    inp["lower_bound"] = lb
    return inp


def _spec_pseudocode_gold(inp):
    """§2.2 gold pseudo-code transcribed literally: scalar loops over (n, h, t), fp64 vectors."""
    q, k, v, g, beta = (inp[x].double() for x in ("q", "k", "v", "g", "beta"))
    A_log, dt, lb, scale = inp["A_log"].double(), inp["dt_bias"].double(), inp["lower_bound"], \
        inp["scale"]
    h0, cu = inp["initial_state"], inp["cu_seqlens"].tolist()
    o = torch.zeros_like(q)
    ht = torch.zeros(len(cu) - 1, q.shape[2], 128, 128, dtype=torch.float64)
    for n in range(len(cu) - 1):
        for h in range(q.shape[2]):
            S = h0[n, h].double() if h0 is not None else torch.zeros(128, 128, dtype=torch.float64)
            for t in range(cu[n], cu[n + 1]):
                qh = q[0, t, h] / torch.sqrt((q[0, t, h] ** 2).sum() + 1e-6)
                kh = k[0, t, h] / torch.sqrt((k[0, t, h] ** 2).sum() + 1e-6)
                a = lb * torch.sigmoid(torch.exp(A_log[h]) * (g[0, t, h] + dt[h]))
                b = torch.sigmoid(beta[0, t, h])
                S = S * torch.exp(a)[None, :]
                S = S + torch.outer(b * (v[0, t, h] - S @ kh), kh)
                o[0, t, h] = S @ (scale * qh)
            ht[n, h] = S
    return o, ht


def test_rel_rmse():
    b = torch.randn(64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert rel_rmse(b, b) == 0.0
    assert rel_rmse(2 * b, b) == pytest.approx(1.0, rel=1e-8)  # 1e-8 guard in the denominator
    assert rel_rmse(b.float(), b) < 1e-7  # float64 math: fp32 rounding is visible but tiny
    assert rel_rmse(b.float(), b) > 0.0


def test_make_inputs_shapes_and_dtypes():
    inp = make_inputs(VARLEN, 3, 0, state="fp32")
    assert inp["q"].shape == (1, sum(VARLEN), 3, 128) and inp["q"].dtype == torch.bfloat16
    assert inp["beta"].shape == (1, sum(VARLEN), 3) and inp["beta"].dtype == torch.bfloat16
    assert inp["cu_seqlens"].dtype == torch.int32
    assert inp["cu_seqlens"].tolist() == [0, 1, 16, 32, 49, 49, 89]
    assert inp["initial_state"].shape == (6, 3, 128, 128)
    assert inp["initial_state"].dtype == torch.float32
    assert inp["A_log"].shape == (3,) and inp["dt_bias"].shape == (3, 128)
    for key in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state"):
        assert inp[key].abs().max() > 0, key
    dense = make_inputs((2, 33), 1, 0, state="bf16")
    assert dense["cu_seqlens"] is None and dense["q"].shape == (2, 33, 1, 128)
    assert dense["initial_state"].dtype == torch.bfloat16
    assert make_inputs((2, 33), 1, 0)["initial_state"] is None
    assert torch.equal(make_inputs((2, 33), 1, 5)["q"], make_inputs((2, 33), 1, 5)["q"])


def test_gold_matches_spec_pseudocode():
    """Guards the preprocessing shared by gold and chunked (l2 norm, gate, beta, scale)."""
    inp = make_inputs([3, 0, 20], 2, 1, state="fp32")
    inp["lower_bound"] = -0.1  # slow decay: the initial state matters for every token
    o, ht = gold_prefill(**inp)
    o_ref, ht_ref = _spec_pseudocode_gold(inp)
    assert rel_rmse(o, o_ref) < 1e-13
    assert rel_rmse(ht, ht_ref) < 1e-13


@pytest.mark.parametrize("lb", [-5.0, -1.0, -0.1])
@pytest.mark.parametrize("state", [None, "bf16", "fp32"])
@pytest.mark.parametrize("case", list(CASES))
def test_chunked_vs_gold(case, state, lb):
    inp = _inputs(case, state, lb)
    o_g, s_g = gold_prefill(**inp)
    o_x, s_x = chunked_prefill(**inp, mode="exact")
    o_e, s_e = chunked_prefill(**inp, mode="emulate")
    assert o_g.dtype == o_x.dtype == s_g.dtype == s_x.dtype == torch.float64
    assert o_e.dtype == s_e.dtype == torch.bfloat16
    assert rel_rmse(o_x, o_g) < EXACT_TOL
    assert rel_rmse(s_x, s_g) < EXACT_TOL
    assert rel_rmse(o_e, o_g) < EMU_TOL
    assert rel_rmse(s_e, s_g) < EMU_TOL
    # The emulation must actually round (bf16 outputs differ from exact math at ~1e-3).
    assert rel_rmse(o_e, o_x) > 1e-4


@pytest.mark.parametrize("mode", MODES)
def test_empty_sequence_keeps_state(mode):
    inp = _inputs("varlen", "fp32", lb=-1.0)
    _, s = _run(mode, inp)
    h0 = inp["initial_state"][4]
    expect = h0.to(torch.bfloat16) if mode == "emulate" else h0.double()  # Q6: bf(initial)
    assert torch.equal(s[4], expect)
    _, s_none = _run(mode, _inputs("varlen", None, lb=-1.0))
    assert torch.equal(s_none[4], torch.zeros_like(s_none[4]))
    assert s_none[3].abs().max() > 0  # non-empty neighbours do write their state


def test_emulate_fp32_state_is_rounded_on_entry():
    """Q6: an fp32 initial state enters as bf(initial); gold keeps it unrounded."""
    inp = _inputs("dense", "fp32", lb=-0.1)
    inp_bf = dict(inp, initial_state=inp["initial_state"].to(torch.bfloat16))
    o32, s32 = chunked_prefill(**inp)
    o16, s16 = chunked_prefill(**inp_bf)
    assert torch.equal(o32, o16) and torch.equal(s32, s16)
    o_g32, _ = gold_prefill(**inp)
    o_g16, _ = gold_prefill(**inp_bf)
    assert not torch.equal(o_g32, o_g16)


def _slice_sequence(inp, i):
    cu = inp["cu_seqlens"].tolist()
    a, b = cu[i], cu[i + 1]
    one = {key: inp[key][:, a:b] for key in ("q", "k", "v", "g", "beta")}
    h0 = inp["initial_state"]
    return dict(inp, **one, cu_seqlens=None, initial_state=None if h0 is None else h0[i:i + 1])


@pytest.mark.parametrize("mode", MODES)
def test_varlen_equals_separate_runs(mode):
    inp = _inputs("varlen", "bf16", lb=-1.0)
    o, s = _run(mode, inp)
    cu = inp["cu_seqlens"].tolist()
    for i in range(len(VARLEN)):
        o_i, s_i = _run(mode, _slice_sequence(inp, i))
        assert torch.equal(o[:, cu[i]:cu[i + 1]], o_i), i
        assert torch.equal(s[i:i + 1], s_i), i


@pytest.mark.parametrize("mode", MODES)
def test_dense_batch_rows_equal_separate_runs(mode):
    inp = _inputs("batch2", "fp32", lb=-1.0, H=3)
    o, s = _run(mode, inp)
    for b in range(2):
        one = {key: inp[key][b:b + 1] for key in ("q", "k", "v", "g", "beta", "initial_state")}
        o_b, s_b = _run(mode, dict(inp, **one))
        assert torch.equal(o[b:b + 1], o_b), b
        assert torch.equal(s[b:b + 1], s_b), b


@pytest.mark.parametrize("poisoned", [2, 3])  # 2 follows a partial tile; 3 has a partial tile
@pytest.mark.parametrize("mode", MODES)
def test_nan_in_one_sequence_stays_there(mode, poisoned):
    """§6.1/§6.6: padded rows must be masked, not 'neighbour data x 0'."""
    inp = _inputs("varlen", "bf16", lb=-1.0)
    o_clean, s_clean = _run(mode, inp)
    cu = inp["cu_seqlens"].tolist()
    a, b = cu[poisoned], cu[poisoned + 1]
    bad = dict(inp)
    for key in ("q", "k", "v", "g", "beta"):
        bad[key] = inp[key].clone()
        bad[key][:, a:b] = float("nan")
    o_bad, s_bad = _run(mode, bad)
    assert torch.isnan(o_bad[:, a:b]).all()  # the poison did reach its own sequence
    assert torch.isnan(s_bad[poisoned]).any()
    others = torch.ones(o_bad.shape[1], dtype=torch.bool)
    others[a:b] = False
    assert torch.isfinite(o_bad[:, others]).all()
    assert torch.equal(o_bad[:, others], o_clean[:, others])
    for i in range(len(VARLEN)):
        if i != poisoned:
            assert torch.equal(s_bad[i], s_clean[i]), i


def _acc32(a, b):
    return (a.double() @ b.double()).float()


def _sig_tanh(x):  # fma(tanh(0.5x), 0.5, 0.5), the fma done exactly in fp64
    return (torch.tanh(x * 0.5).double() * 0.5 + 0.5).float()


def _l2n_p1(x):  # P1: 16 lanes of 8 elements; the butterfly leaves the total in every lane
    p = torch.zeros(x.shape[0], 16)
    for i in range(8):
        p = (x[:, i::8].double() ** 2 + p.double()).float()
    for off in (8, 4, 2, 1):
        p = p + p[:, torch.arange(16) ^ off]
    return R._bf(x * torch.repeat_interleave(1.0 / torch.sqrt(p + 1e-6), 8, dim=1))


def _fp32_nearest(x: Fraction) -> float:
    """The fp32 value nearest the exact rational x, ties to even: an oracle independent of the
    module's round-to-odd fma."""
    f = np.float32(float(x))
    best = f
    for cand in (np.nextafter(f, np.float32(np.inf)), np.nextafter(f, np.float32(-np.inf))):
        d_best, d_cand = abs(Fraction(float(best)) - x), abs(Fraction(float(cand)) - x)
        if d_cand < d_best or (d_cand == d_best and int(cand.view(np.uint32)) % 2 == 0):
            best = cand
    return float(best)


def _inverse_by_hand(L):
    """P8 of docs/algorithm.md §2.4 on a 16x16 fp32 L (rows past m are zero), element by element:
    each diagonal 8x8 block by forward substitution with exact fmas (Fractions rounded once), the
    merge P + bf(bf(-P M) P) with fp64-exact products."""
    bf = R._bf
    L = torch.nn.functional.pad(L, (0, 16 - L.shape[1], 0, 16 - L.shape[0]))
    P = torch.zeros(16, 16)
    for base in (0, 8):
        X = [[-float(L[base + i, base + p]) if p < i else float(i == p) for p in range(8)] for i in range(8)]
        for s in range(8):
            for i in range(s + 1, 8):
                for p in range(s):
                    X[i][p] = _fp32_nearest(Fraction(X[i][s]) * Fraction(X[s][p]) + Fraction(X[i][p]))
        P[base:base + 8, base:base + 8] = bf(torch.tensor(X))
    M = torch.zeros(16, 16)
    M[8:, :8] = bf(L[8:, :8])
    return bf(P + bf(_acc32(bf(-_acc32(P, M)), P)))


def _one_tile_by_hand(inp, h):
    """§2.4 table transcribed for one tile of m = T <= 16 rows of head h, on m x m matrices (the
    module works on padded 16 x 16 tiles; zero rows/columns must not change any value)."""
    bf, f32 = R._bf, torch.float32
    q, k, v, g = (inp[x][0, :, h].float() for x in ("q", "k", "v", "g"))
    S = inp["initial_state"][0, h].float()
    m = q.shape[0]
    A = torch.exp2(inp["A_log"][h] * torch.tensor(R.LOG2E, dtype=f32))
    c = torch.tensor(inp["lower_bound"] * R.LOG2E, dtype=f32)
    a2 = c * _sig_tanh(A * (g + inp["dt_bias"][h]))  # P2
    G = a2.clone()
    for i in range(1, m):  # P3: sequential fp32 cumsum
        G[i] = G[i - 1] + a2[i]
    e, ebar, gam = bf(torch.exp2(G)), bf(torch.exp2(-G)), torch.exp2(G[-1])  # P4
    qh, kh = _l2n_p1(q), _l2n_p1(k)
    Qd = bf(bf(qh * e) * bf(torch.tensor(inp["scale"], dtype=f32)))  # P5
    Kd, Ki = bf(kh * e), bf(kh * ebar)
    Kr = bf(Ki * bf(gam))
    b = _sig_tanh(inp["beta"][0, :, h].float())
    L = torch.tril(_acc32(Kd, Ki.T), -1) * b[:, None]  # P6: fp32
    Mqk = torch.tril(bf(_acc32(Qd, Ki.T)))  # P7
    INV = _inverse_by_hand(L)[:m, :m]  # P8
    u, o1 = bf(_acc32(Kd, S.T)), bf(_acc32(Qd, S.T))  # Q1
    r = bf(bf(v - u) * bf(b)[:, None])  # Q2
    U = bf(_acc32(INV, r))  # Q3
    out = bf(o1 + bf(_acc32(Mqk, U)))  # Q4
    dS = _acc32(U.T, Kr)  # Q5: (Kr^T U)^T in fp32, [V, K]
    S_new = bf((S.double() * gam.double()[None, :] + dS.double()).float())  # one fma, then bf
    return out, S_new


@pytest.mark.parametrize("T", [1, 5, 16])
def test_emulate_one_tile_by_hand(T):
    """Bitwise: a missing or misplaced bf/hf rounding of P1-P8/Q1-Q5 shows up here (T=1 has L=0;
    T=5 has L^2 != 0 and padding; T=16 is a full tile)."""
    inp = make_inputs((1, T), 2, 7, state="bf16")
    inp["lower_bound"] = -1.0
    o, s = chunked_prefill(**inp)
    for h in range(2):
        out, S_new = _one_tile_by_hand(inp, h)
        assert torch.equal(o[0, :, h].float(), out), h
        assert torch.equal(s[0, h].float(), S_new), h


@pytest.mark.parametrize("mode", MODES)
def test_tile_aligned_split_is_bitwise(mode):
    """Running tokens [0,16), then [16,48) from the returned state, equals one run of [0,48): the
    chunked state between tiles is exactly what is returned (bf16 in emulation, Q5/Q6)."""
    inp = _inputs("dense", "bf16", lb=-0.1)
    inp = dict(inp, **{x: inp[x][:, :48] for x in ("q", "k", "v", "g", "beta")})
    o, s = _run(mode, inp)
    first = dict(inp, **{x: inp[x][:, :16] for x in ("q", "k", "v", "g", "beta")})
    o1, s1 = _run(mode, first)
    second = dict(inp, **{x: inp[x][:, 16:] for x in ("q", "k", "v", "g", "beta")},
                  initial_state=s1)
    o2, s2 = _run(mode, second)
    if mode == "exact":
        # float64 throughout: the split changes the shapes the CPU BLAS sees, and with them its
        # summation order, so equality holds to the last few ulps only (1e-17 seen on outputs of
        # magnitude 0.07), which a missing or wrong state hand-over would exceed by far.
        torch.testing.assert_close(o, torch.cat([o1, o2], dim=1), rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(s, s2, rtol=1e-12, atol=1e-14)
        return
    assert torch.equal(o, torch.cat([o1, o2], dim=1))
    assert torch.equal(s, s2)


class _Counting:
    """approx= hooks that count calls; `tanh_scale` perturbs tanh to show it is really used."""

    def __init__(self, tanh_scale=1.0):
        self.calls = {"ex2": 0, "tanh": 0, "rsqrt": 0}
        self.tanh_scale = tanh_scale

    def ex2(self, x):
        self.calls["ex2"] += 1
        return R._ex2(x)

    def tanh(self, x):
        self.calls["tanh"] += 1
        return R._tanh(x) * self.tanh_scale

    def rsqrt(self, x):
        self.calls["rsqrt"] += 1
        return R._rsqrt(x)


def test_approx_override_is_used():
    inp = _inputs("dense", "bf16")
    o, s = chunked_prefill(**inp)
    same = _Counting()
    o_same, s_same = chunked_prefill(**inp, approx=same)
    assert all(n > 0 for n in same.calls.values()), same.calls
    assert torch.equal(o, o_same) and torch.equal(s, s_same)
    o_pert, _ = chunked_prefill(**inp, approx=_Counting(tanh_scale=0.9))
    assert rel_rmse(o_pert, o) > 1e-3


def test_emulate_pieces():
    """Rounding primitives, the exact fp32 fma and the stable inverse (P8) on their own."""
    x = torch.tensor([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 1.0 + 2.0 ** -11])
    assert R._bf(x).tolist() == [1.0, 1.0 + 2.0 ** -6, 1.0]  # ties to even
    # a * b is an fp32 midpoint and c nudges it up by less than half an fp64 ulp: an fp64 sum
    # rounds back onto the midpoint (then ties to even, down), one rounding goes up
    a = torch.tensor([1.0 + 2.0 ** -12])
    c = torch.tensor([2.0 ** -60])
    exact = Fraction(float(a)) ** 2 + Fraction(float(c))
    assert float(R._fma32_rn(a, a, c)) == _fp32_nearest(exact) == 1.0 + 2.0 ** -11 + 2.0 ** -23
    assert float(R._fma32(a, a, c)) == 1.0 + 2.0 ** -11
    gen = torch.Generator().manual_seed(0)
    eye = torch.eye(16, dtype=torch.float64)
    noise = torch.tril(torch.rand(2, 3, 16, 16, generator=gen), -1)
    # random entries, and nearly parallel keys with a large beta (entries of L near sigma(6))
    for L in (noise[0] * 0.3, torch.tril(torch.full((3, 16, 16), 0.9975), -1) - noise[1] * 1e-3):
        inv_true = torch.linalg.inv(eye + L.double())
        inv_exact = R._inverse16(R._ExactMath(), L.double())
        assert (inv_exact - inv_true).abs().max() < 1e-12
        inv_emu = R._inverse16(R._EmulateMath(), L)
        err = (inv_emu.double() - inv_true).abs().max()
        assert 0 < err < 4e-3, err  # bf16 storage of entries up to 1
        assert torch.equal(R._bf(inv_emu), inv_emu)
        assert torch.equal(inv_emu[0], _inverse_by_hand(L[0]))


def test_emulate_l2norm_matches_exact():
    x = torch.randn(5, 7, 128, generator=torch.Generator().manual_seed(3)).bfloat16().float()
    got = R._EmulateMath().l2n(x)
    want = R._ExactMath().l2n(x.double())
    assert torch.equal(R._bf(got), got)
    assert (got.double() - want).abs().max() < 2.0 ** -8
    assert torch.equal(R._EmulateMath().l2n(torch.zeros(2, 128)), torch.zeros(2, 128))


def test_bad_arguments_raise():
    inp = _inputs("batch2", None)
    with pytest.raises(ValueError):
        gold_prefill(**dict(inp, cu_seqlens=torch.tensor([0, 33, 66], dtype=torch.int32)))
    with pytest.raises(ValueError):
        chunked_prefill(**inp, mode="fast")
    v = _inputs("varlen", None)
    with pytest.raises(ValueError):
        chunked_prefill(**dict(v, cu_seqlens=torch.tensor([0, 50, 88], dtype=torch.int32)))


def test_m_seg_swizzle_is_an_involution_and_conflict_free():
    """The m_seg layout of docs/kernel_abi.md: element (r, c) at column c ^ 8 (r & 3). The merge reads
    B fragments of an unpadded 128-word-row copy: lane (g, q) loads rows k0 + q and k0 + q + 4,
    logical column n0 + g; the 32 lanes must hit 32 distinct banks for every k-step and n-tile."""
    m = torch.randn(2, 3, R.D, R.D)
    s = R.m_seg_swizzle(m)
    assert torch.equal(R.m_seg_swizzle(s), m)
    assert not torch.equal(s, m)
    for r in (0, 1, 2, 3, 77):
        for c in (0, 5, 8, 31, 127):
            assert s[1, 2, r, c ^ (8 * (r & 3))] == m[1, 2, r, c]
    pos = torch.arange(R.D * R.D).view(R.D, R.D).float()
    where = R.m_seg_swizzle(pos)  # physical position -> logical element; invert it
    phys = torch.empty(R.D * R.D, dtype=torch.long)
    phys[where.flatten().long()] = torch.arange(R.D * R.D)
    for k0 in range(0, R.D, 8):
        for n0 in range(0, R.D, 8):
            for dk in (0, 4):
                banks = {int(phys[(k0 + q + dk) * R.D + n0 + g]) % 32 for g in range(8) for q in range(4)}
                assert len(banks) == 32, (k0, n0, dk)
