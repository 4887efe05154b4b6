"""K1 alone on the GPU: every workspace region against the reference's K1 stage, bit for bit.

Runs the sequence tables and K1 through the loader into a poisoned workspace, de-interleaves the
raw tile images (docs/kernel_abi.md) and compares each quantity with
reference._prepare_tiles run on the GPU with the kernels' PTX approximations.
"""

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]
torch = pytest.importorskip("torch")


def _raw_to_rows(images):
    """[..., 2048] bf16 raw images -> [..., 16, 128]: element (r, c) at
    64*((r>>3) + 2*(c>>3)) + 8*(r&7) + (c&7)."""
    r = torch.arange(16, device=images.device)[:, None]
    c = torch.arange(128, device=images.device)[None, :]
    idx = 64 * ((r >> 3) + 2 * (c >> 3)) + 8 * (r & 7) + (c & 7)
    return images[..., idx]


def _run_k1(lib, x, kernel="k1_prepare"):
    from kda_aot.plan import launcher, planner
    from kda_aot.plan.workspace import workspace_layout

    q = x["q"]
    B, T, H, _ = q.shape
    cu = x["cu_seqlens"]
    varlen = cu is not None
    N = cu.numel() - 1 if varlen else B
    cap = planner.tile_capacity(B * T if varlen else T, N, varlen)
    layout = workspace_layout(H, cap, N)
    ws = torch.full((layout.nbytes,), 0xFF, dtype=torch.uint8, device="cuda")  # poison: bf16 NaN
    p = layout.pointers(ws.data_ptr())
    stream = torch.cuda.current_stream().cuda_stream
    if varlen:
        lib.kernel("seq_tables_int32")(cu.data_ptr(), p["seq_start"], p["tile_prefix"], p["seq_order"], N, B * T,
                                       stream)
    else:
        lib.kernel("seq_tables_dense")(p["seq_start"], p["tile_prefix"], N, T, stream)
    lib.kernel(kernel)(q.data_ptr(), x["k"].data_ptr(), x["g"].data_ptr(), x["beta"].data_ptr(),
                             x["A_log"].data_ptr(), x["dt_bias"].data_ptr(), p["seq_start"], p["tile_prefix"],
                             p["qd"], p["kd"], p["kr"], p["gt"], p["inv"], p["mqk"], p["bsig"],
                             B * T, N, H, cap, *(H * 128, 128) * 3, H, x["scale"],
                             launcher.gate_constant(x["lower_bound"]), stream)  # packed q, k, g, beta strides
    torch.cuda.synchronize()

    def region(name, dtype, per_slot):
        off, nbytes = layout.regions[name]
        if name == "bsig":  # two planes of [H, cap] slots (docs/kernel_abi.md): -> [H, cap, plane, 16]
            return ws[off:off + nbytes].view(dtype).view(2, H, cap, 16).permute(1, 2, 0, 3)
        return ws[off:off + nbytes].view(dtype).view(H, cap, *per_slot)

    bsig = region("bsig", torch.bfloat16, (2, 16))
    return dict(qd=_raw_to_rows(region("qd", torch.bfloat16, (2048,))),
                kd=_raw_to_rows(region("kd", torch.bfloat16, (2048,))),
                kr=_raw_to_rows(region("kr", torch.bfloat16, (2048,))),
                gt=region("gt", torch.float32, (128,)), inv=region("inv", torch.bfloat16, (16, 16)),
                mqk=region("mqk", torch.bfloat16, (16, 16)), bsig=bsig[:, :, 0], bsig_lo=bsig[:, :, 1])


def _reference_tiles(x, approx, accurate=False):
    """Per sequence: the reference's K1 quantities, [tiles, H, ...] (K1' with `accurate`)."""
    from kda_aot import reference

    m = (reference._AccurateMath if accurate else reference._EmulateMath)(approx)
    q = x["q"]
    B, T, H, _ = q.shape
    cu = x["cu_seqlens"]
    bounds = ([(0, b, b * T, (b + 1) * T) for b in range(B)] if cu is None else
              [(0, i, int(cu[i]), int(cu[i + 1])) for i in range(cu.numel() - 1)])
    flat = {n: x[n].reshape(B * T, H, *x[n].shape[3:]).float() for n in ("q", "k", "g", "beta")}
    out = []
    for _, _, a, b in bounds:
        if b == a:
            out.append(None)
            continue
        tiles = reference._prepare_tiles(m, flat["q"][a:b], flat["k"][a:b], flat["g"][a:b], flat["beta"][a:b],
                                         x["A_log"].float(), x["dt_bias"].float().reshape(H, 128),
                                         x["lower_bound"], x["scale"], b - a)
        out.append(tiles)
    return out


@pytest.mark.parametrize("kernel", ["k1_prepare", "k1_prepare_acc"])
# The last case has 70 sequences (empty ones among them): each warp's lookup of its tile's
# sequence (k1_prepare._locate_tile) takes three passes of 32, and most tiles match after the first.
@pytest.mark.parametrize("shape,H", [((1, 77), 3), ((2, 32), 2), ([1, 15, 16, 17, 0, 100], 2),
                                     ([(7 * i) % 23 + 16 * (i % 5 == 4) for i in range(70)], 2)])
def test_k1_workspace_matches_reference(gpu_approx, shape, H, kernel):
    """K1 against the FlashKDA recipe's K1 stage, K1' (numerics="accurate", the gated operands
    rounded once) against the accurate emulation's: every region bit for bit."""
    from kda_aot import reference
    from kda_aot.library.loader import get_library

    lib = get_library()
    if not lib.has(kernel):  # a broken build, not a reason to skip
        pytest.fail(f"the kernel library has no {kernel}: every build ships it")
    x = reference.make_inputs(shape, H, seed=7, device="cuda")
    x["scale"] = 128 ** -0.5
    ws = _run_k1(lib, x, kernel)
    tile = 0
    for seq, ref in enumerate(_reference_tiles(x, gpu_approx, accurate=kernel.endswith("_acc"))):
        if ref is None:
            continue
        Qd, Kd, Kr, gam, b, INV, Mqk = ref  # [nt, H, ...]
        nt = Qd.shape[0]
        sl = slice(tile, tile + nt)
        got = {k: v[:, sl].transpose(0, 1) for k, v in ws.items()}  # [nt, H, ...]
        want = dict(qd=Qd, kd=Kd, kr=Kr, gt=gam, inv=INV, mqk=Mqk)
        for name, ref_val in want.items():
            g = got[name].float()
            diff = (g - ref_val.float()).abs()
            bad = int((diff > 0).sum()) + int(torch.isnan(g).sum())
            assert bad == 0, (f"sequence {seq} {name}: {bad} of {g.numel()} elements differ, "
                              f"max |diff| {float(diff.nan_to_num(0).max()):.3e}")
        length = int(x["cu_seqlens"][seq + 1] - x["cu_seqlens"][seq]) if x["cu_seqlens"] is not None else shape[1]
        valid = (torch.arange(nt * 16, device="cuda") < length).view(nt, 1, 16)
        want_b = torch.where(valid, b, torch.zeros_like(b)).to(torch.bfloat16).float()
        assert torch.equal(got["bsig"].float(), want_b), f"sequence {seq} bsig differs"
        if kernel.endswith("_acc"):  # K1' adds the residue plane: bf(sigma - bf(sigma)), 0 on padded rows
            b_hi = b.float().to(torch.bfloat16).float()
            want_lo = torch.where(valid, b.float() - b_hi, torch.zeros_like(b_hi)).to(torch.bfloat16).float()
            assert torch.equal(got["bsig_lo"].float(), want_lo), f"sequence {seq} bsig residue differs"
        else:  # FlashKDA's K1 leaves the residue plane alone: still the poison
            assert bool((got["bsig_lo"].view(torch.int16) == -1).all()), f"sequence {seq}: K1 wrote the residue plane"
        tile += nt
