"""Cross-GPU context parallelism with 2, 3 and 4 ranks as processes on the one GPU (gloo backend):
kda_aot.distributed.prefill against single-GPU prefill of the whole batch (docs/distributed.md).

Inputs keep state over thousands of tokens (g ~ N(-8, 1)), so a wrong or missing carry shows.
Per rank (cp="off"): the rows of sequences that begin on it equal serial bit for bit, and so do the
final states of those sequences; everything is as close to the float64 gold as serial is (the CP
bound of tests/gpu/test_cp_long_memory.py).
"""

import os
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(400)]
torch = pytest.importorskip("torch")

SLACK, FLOOR = 1.1, 2e-4  # as tests/gpu/test_cp_long_memory.py

# name: world, lengths, interior cut points, H, state dtype, cp, host lengths, final states
CASES = {
    "w2 one sequence, aligned cut, fp32": (2, [4096], [2000], 4, "fp32", "off", True, True),
    "w2 varlen, unaligned cut, bf16, device cu_seqlens": (2, [3000, 1100], [1701], 4, "bf16", "off", False, True),
    "w3 varlen spanning and inside, empty sequence, bf16": (3, [1500, 3000, 700, 0, 900], [1000, 4003], 4, "bf16",
                                                            "off", True, True),
    "w3 middle rank transfer, no state, cp auto": (3, [6000], [1000, 5009], 2, None, "auto", True, True),
    "w4 empty slice, middle rank, fp32": (4, [6000, 200], [1000, 1000, 3517], 4, "fp32", "off", True, True),
    "w4 no final state": (4, [500, 2500, 40], [300, 1200, 2900], 4, "fp32", "off", True, False),
    "w4 empty last ranks own a trailing empty sequence": (4, [2000, 0], [700, 2000, 2000], 4, "bf16", "off", True,
                                                          True),
}
EXACT = {"w2 one sequence, aligned cut, fp32"}  # a reset carry at a tile-aligned cut is serial's state


def _inputs(lens, H, state, seed):
    from kda_aot import reference

    x = reference.make_inputs(list(lens), H, seed=seed, state=state)
    gen = torch.Generator().manual_seed(seed + 100)
    x["g"] = (torch.randn(x["g"].shape, generator=gen) - 8.0).to(torch.bfloat16)
    return x


def _slices(lens, cuts):
    pts = [0] + list(cuts) + [sum(lens)]
    return [(a, b - a) for a, b in zip(pts, pts[1:])]


@pytest.fixture(scope="module")
def case_inputs():
    return {name: dict(world=c[0], lens=c[1], slices=_slices(c[1], c[2]), inputs=_inputs(c[1], c[3], c[4], seed=i),
                       cp=c[5], hint=c[6], final=c[7])
            for i, (name, c) in enumerate(CASES.items())}


def _run_world(world, case_inputs, tmp_path):
    cases_file = tmp_path / "cases.pt"
    torch.save(case_inputs, cases_file)
    worker = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "distributed_worker.py")
    init = tmp_path / "init"
    procs = [subprocess.Popen([sys.executable, worker, str(r), str(world), str(init), str(cases_file), str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    logs, deadline = [], time.monotonic() + 90
    for p in procs:
        try:
            logs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"a rank of the {world}-rank run did not finish in 90 s")
    failed = [(r, log) for r, (p, log) in enumerate(zip(procs, logs)) if p.returncode != 0]
    # every failed rank's log: the first to fail is the cause, the others lost their peer
    assert not failed, "\n".join(f"rank {r} of {world} failed:\n{log[-3000:]}" for r, log in failed)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_distributed_prefill_equals_single_gpu(world, case_inputs, tmp_path):
    import kda_aot
    from kda_aot import reference

    mine = {name: c for name, c in case_inputs.items() if c["world"] == world}
    assert mine
    _run_world(world, mine, tmp_path)
    for name, c in mine.items():
        x = {n: (v.cuda() if torch.is_tensor(v) else v) for n, v in c["inputs"].items()}
        serial = kda_aot.prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                                 lower_bound=x["lower_bound"], initial_state=x["initial_state"],
                                 output_final_state=True, cu_seqlens=x["cu_seqlens"], cp="off")
        gold = reference.gold_prefill(**x)
        ranks = [torch.load(tmp_path / f"{name}.{r}.pt") for r in range(world)]
        o = torch.cat([r["o"] for r in ranks], dim=1).cuda()
        assert not torch.isnan(o).any(), name
        starts = [0]
        for n in c["lens"]:
            starts.append(starts[-1] + n)
        finals = {}
        exact = c["cp"] == "off"  # with intracard CP inside a rank only its first segments are serial's
        for r, (res, (off, t)) in enumerate(zip(ranks, c["slices"])):
            h = res["head_len"]
            # rows of sequences that begin on this rank: bit for bit serial
            assert not exact or torch.equal(res["o"][:, h:].cuda(), serial[0][:, off + h:off + t]), (name, r)
            if c["final"]:
                assert len(res["final_seqs"]) == res["final_state"].shape[0]
                for i, n in enumerate(res["final_seqs"]):
                    finals[n] = res["final_state"][i].cuda()
                    if exact and starts[n] >= off:  # began on this rank: bit for bit serial
                        assert torch.equal(finals[n], serial[1][n]), (name, r, n)
            else:
                assert res["final_state"] is None
        if c["final"]:
            assert sorted(finals) == list(range(len(c["lens"]))), name
            fs = torch.stack([finals[n] for n in range(len(c["lens"]))])
            assert fs.dtype == serial[1].dtype and not torch.isnan(fs).any()
        e_ser = reference.rel_rmse(serial[0], gold[0])
        e_dist = reference.rel_rmse(o, gold[0])
        assert e_dist <= SLACK * e_ser + FLOOR, (name, e_dist, e_ser)
        if c["final"]:
            f_ser, f_dist = reference.rel_rmse(serial[1], gold[1]), reference.rel_rmse(fs, gold[1])
            assert f_dist <= SLACK * f_ser + FLOOR, (name, f_dist, f_ser)
        if name in EXACT:
            assert torch.equal(o, serial[0]) and torch.equal(fs, serial[1]), name
        print(f"\n{name}: output vs gold serial {e_ser:.3e} distributed {e_dist:.3e}; vs serial "
              f"{reference.rel_rmse(o, serial[0]):.2e}; kinds {[r['kind'] for r in ranks]}")


def _transfer_case():
    x = _inputs([400], 2, "fp32", seed=9)  # 25 tiles; the state still remembers S0 at the end
    x["initial_state"] = x["initial_state"] * 10  # S0 ~ N(0, 1): the S0 M term weighs in the final state
    return {n: (v.cuda() if torch.is_tensor(v) else v) for n, v in x.items()}


@pytest.mark.parametrize("segments", [1, 3])
def test_slice_transfer_against_float64(segments):
    """The transfer of a slice (K1 + pre_scan over its segments, folded in fp32): M and B against
    float64 (M: the run from S = I with v = 0, docs/algorithm.md §4.2), and S0 M + B against serial
    from S0; one segment's B is K2 from zero bit for bit (§4.6)."""
    import kda_aot
    import kda_aot.distributed as kd
    from kda_aot import reference

    x = _transfer_case()
    common = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=x["lower_bound"])
    toks = {n: x[n] for n in ("q", "k", "v", "g", "beta")}
    M, B = kd.slice_transfer(**toks, **common, segments=segments)
    eye = torch.eye(128, dtype=torch.float32, device="cuda").expand(1, 2, 128, 128).contiguous()
    _, m_gold = reference.gold_prefill(**dict(x, v=torch.zeros_like(x["v"]), initial_state=eye))
    _, b_gold = reference.gold_prefill(**dict(x, initial_state=None))
    _, s_gold = reference.gold_prefill(**x)
    assert reference.rel_rmse(M, m_gold[0]) < 2e-2 and reference.rel_rmse(B, b_gold[0]) < 2e-2
    _, serial = kda_aot.prefill(**toks, **common, initial_state=x["initial_state"], output_final_state=True, cp="off")
    _, from_zero = kda_aot.prefill(**toks, **common, output_final_state=True, cp="off")
    if segments == 1:
        assert torch.equal(B, from_zero[0])
    with kd.ieee_fp32_matmul():
        got = torch.baddbmm(B, x["initial_state"][0], M)
    # S0 M + B is unrounded fp32 while serial's state ends in bf16: bounded by twice serial's error
    e_ser, e_tr = reference.rel_rmse(serial[0], s_gold[0]), reference.rel_rmse(got, s_gold[0])
    assert e_tr <= 2 * e_ser + FLOOR, (e_tr, e_ser)
    # the entering state matters on this slice: leaving out S0 M misses the bound
    assert reference.rel_rmse(B, s_gold[0]) > 2 * e_ser + FLOOR, (reference.rel_rmse(B, s_gold[0]), e_ser)
