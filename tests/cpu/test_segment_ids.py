"""Listed sequences (`segment_ids`, docs/state_pool.md "Listed sequences") on the CPU: the wall,
the host check of validate="host", the workspace, and what a listed call launches (recorded, no
GPU). tests/gpu/test_segment_ids.py runs the same calls on the device.
"""

import sys
from pathlib import Path

import pytest

from kda_aot.intake.arguments import check_segment_ids_host
from kda_aot.intake.validation import validate_prefill

sys.path.insert(0, str(Path(__file__).parent))  # the sibling helpers below, when run on its own
from test_state_pool import _ws, rec  # noqa: E402,F401  (rec: the recording fixture)
from test_validation import desc, make_args  # noqa: E402

D = 128


def listed_args(N=3, M=2, dtype="int32", shape=None, **kw):
    args = make_args(B=1, T=64, H=4, cu=N + 1, cu_dtype="int32", **kw)
    args["segment_ids"] = desc("segment_ids", shape or (M,), dtype)
    return args


def test_problem_records_the_list():
    p = validate_prefill(**listed_args(M=2))
    assert p.listed and p.n_listed == 2
    empty = validate_prefill(**listed_args(M=0))
    assert empty.listed and empty.n_listed == 0
    plain = validate_prefill(**dict(listed_args(), segment_ids=None))
    assert not plain.listed and plain.n_listed == 0


@pytest.mark.parametrize("change, error, message", [
    (dict(shape=(2, 1)), ValueError, r"^segment_ids: expected int32 \[M\]"),
    (dict(dtype="int64"), TypeError, r"^segment_ids: "),
])
def test_wall_refusals(change, error, message):
    with pytest.raises(error, match=message):
        validate_prefill(**listed_args(**change))


def test_accurate_numerics_is_refused():
    with pytest.raises(NotImplementedError, match=r"^segment_ids: not built with numerics='accurate'"):
        validate_prefill(**dict(listed_args(), numerics="accurate"))


def test_host_check():
    check_segment_ids_host([2, 0, 1], 3)
    check_segment_ids_host([], 3)
    with pytest.raises(ValueError, match=r"^segment_ids: entry 1 = 3 is not a sequence index in \[0, 3\)"):
        check_segment_ids_host([0, 3], 3)
    with pytest.raises(ValueError, match=r"^segment_ids: entry 0 = -1 "):
        check_segment_ids_host([-1], 3)
    with pytest.raises(ValueError, match=r"^segment_ids: sequence 2 appears at entries 0 and 2"):
        check_segment_ids_host([2, 1, 2], 3)
    with pytest.raises(TypeError, match=r"^segment_ids: entry 0"):
        check_segment_ids_host([True], 3)


def test_workspace_holds_the_flags_and_slots():
    from kda_aot.plan.workspace import cp_layout, workspace_layout

    serial = workspace_layout(4, 100, 7, listed=7)
    assert serial.regions["listed"][1] == serial.regions["listed_slot"][1] == 28
    assert serial.nbytes > workspace_layout(4, 100, 7).nbytes
    cp = cp_layout(4, 100, 7, 16, listed=7)
    assert cp.regions["listed"][1] == 28 and "listed_slot" not in cp.regions


def test_flashkda_workspace_size_covers_listed_calls():
    pytest.importorskip("torch")
    from kda_aot import flashkda_compat
    from kda_aot.plan.workspace import workspace_layout

    need = workspace_layout(4, 64 // 16 + 3, 3, checkpoint_entries=6, listed=3).nbytes
    assert flashkda_compat.get_workspace_size(64, 4, 3) >= need


# ------------------------------------------------------------------------------------------------
# what a listed call launches (recorded, no GPU; test_state_pool's recorder fixture and workspace)


def test_serial_listed_call_runs_k2_by_slot(rec):
    from recording import call, device_buffer, problem_args

    x = problem_args(H=2, lens=[100, 60, 40], state="float32")
    ids = device_buffer("segment_ids", (2,), "int32")
    call(x, cp="off", segment_ids=ids, output_final_state=True, workspace=_ws())
    names = [launch.name for launch in rec.last]
    assert names == ["seq_tables_listed_int32", "k1_prepare", "k2_regstate_ext_f32_vb64"], names
    tables, k2 = rec.last[0].args, rec.last[-1].args
    assert tables["segment_ids"] == ids.ptr and tables["n_listed"] == 2 and tables["state_indices"] == 0
    assert k2["state_index"] == tables["listed_slot"] != 0, "K2 reads the listed slots (-1: untouched)"
    assert k2["n_pool"] == 3 and k2["seq_order"] == tables["seq_order"] != 0
    assert k2["initial_state"] == x["initial_state"].ptr and k2["final_state"] != 0


def test_serial_listed_pool_call_reads_the_pool_indices_in_the_tables(rec):
    from recording import call, device_buffer, problem_args

    x = problem_args(H=2, lens=[100, 60, 40])
    pool = device_buffer("state_pool", (5, 2, D, D), "bfloat16")
    idx = device_buffer("state_indices", (3,), "int32")
    ids = device_buffer("segment_ids", (1,), "int32")
    call(x, cp="off", state_pool=pool, state_indices=idx, segment_ids=ids, workspace=_ws())
    tables, k2 = rec.last[0].args, rec.last[-1].args
    assert rec.last[0].name == "seq_tables_listed_int32" and tables["state_indices"] == idx.ptr
    assert k2["state_index"] == tables["listed_slot"] and k2["n_pool"] == 5 and k2["final_state"] == pool.ptr


def test_dense_listed_call(rec):
    from recording import call, device_buffer, problem_args

    x = problem_args(H=2, T=100)
    ids = device_buffer("segment_ids", (1,), "int32")
    call(x, cp="off", segment_ids=ids, workspace=_ws())
    tables = rec.last[0].args
    assert rec.last[0].name == "seq_tables_listed_dense" and tables["cu_seqlens"] == 0 and tables["t_total"] == 100


def test_cp_listed_call_cuts_in_the_segment_tables(rec):
    from recording import call, device_buffer, problem_args

    x = problem_args(H=2, lens=[4096, 1000], state="float32")
    ids = device_buffer("segment_ids", (1,), "int32")
    ck = device_buffer("checkpoints", (5096 // 64, 2, D, D), "float32")
    ix = device_buffer("checkpoint_index", (5096 // 64, 2), "int32")
    call(x, cp=4, segment_ids=ids, output_final_state=True, checkpoint_every=64, checkpoints=ck,
         checkpoint_index=ix, workspace=_ws())
    names = [launch.name for launch in rec.last]
    assert names[:3] == ["cp_seg_tables_listed_int32", "seq_tables_int32", "checkpoint_index_listed"], names
    args = {launch.name: launch.args for launch in rec.last}
    flags = args["cp_seg_tables_listed_int32"]["listed"]
    assert flags != 0 and args["checkpoint_index_listed"]["listed"] == flags
    assert args["cp_seg_tables_listed_int32"]["segment_ids"] == ids.ptr


def test_calls_without_a_list_launch_what_they_did(rec):
    from recording import call, problem_args

    call(problem_args(H=2, lens=[100, 60], state="float32"), cp="off", workspace=_ws())
    assert [launch.name for launch in rec.last] == ["seq_tables_int32", "k1_prepare", "k2_regstate_inout_f32_vb64"]


# ------------------------------------------------------------------------------------------------
# the listed tables' twins (tests/cp_twins.py; the GPU tests hold the kernels to them)

def _segments_of(tables, n):
    """(token start, token end, tiles) of each segment of sequence n in device_segment_tables' output."""
    seg_start, seg_prefix, _, seg_first, _, _ = tables
    out = []
    s = seg_first[n]
    while s < len(seg_start) - 1:
        out.append((seg_start[s], seg_start[s + 1], seg_prefix[s + 1] - seg_prefix[s]))
        s += 1
        if s - seg_first[n] >= 64:
            break
    return out


def test_listed_segments_are_the_full_launch_segments_and_end_where_they_should():
    """Every listed sequence is cut into the same segments as without a list (starts, ends, tile
    counts), each ending where the next segment of the call starts; an unlisted sequence has no
    tile, no carry (seg_count 0) and no final slot. Random lengths (empty ones and partial last
    tiles), lists, and the segment parameters of host and device plans."""
    import random

    from cp_twins import device_segment_tables, listed_flags

    rng = random.Random(5)
    for trial in range(400):
        N = rng.choice([1, 2, 3, 8, 40])
        lens = [rng.choice([0, 1, 15, 16, 17, 300, 1000, rng.randint(0, 3000)]) for _ in range(N)]
        cu = [0]
        for x in lens:
            cu.append(cu[-1] + x)
        ids = [rng.randint(-2, N + 1) for _ in range(rng.randint(0, N + 2))]
        flags = listed_flags(ids, N)
        seg_len, max_count, min_tiles = rng.randint(1, 40), rng.randint(1, 8), rng.randint(1, 8)
        S = sum(max(1, min(-(-(-(-x // 16)) // seg_len), max_count, (-(-x // 16)) // min_tiles)) for x in lens)
        params = (seg_len, max_count, min_tiles, S)
        full = device_segment_tables(cu, cu[-1], *params)
        got = device_segment_tables(cu, cu[-1], *params, listed=flags)
        seg_start, seg_prefix, scan, first, count, final = got
        for n in range(N):
            if flags[n]:
                k = full[4][n]
                want = [(a, b, t) for a, b, t in _segments_of(full, n)][:k]
                assert _segments_of(got, n)[:k] == want, (trial, n)
                assert count[n] == k and final[first[n] + k - 1] == n
            else:
                assert count[n] == 0 and final[first[n]] == -1
                assert seg_prefix[first[n] + 1] == seg_prefix[first[n]], "an unlisted sequence has no tile"
                assert seg_start[first[n]] == cu[n], "its boundary segment starts at its first token"
        assert sorted(x for x in final if x >= 0) == [n for n in range(N) if flags[n]]
        assert seg_prefix[-1] == sum(-(-x // 16) for n, x in enumerate(lens) if flags[n])
        assert all(s == -1 or final[s] == -1 for s in scan)


def test_listed_flags_and_slots():
    from cp_twins import device_seq_tables, listed_flags, listed_slots

    flags = listed_flags([3, 3, -1, 99, 0, -2147483648], 5)
    assert flags == [1, 0, 0, 1, 0]
    assert listed_slots(flags) == [0, -1, -1, 3, -1]
    assert listed_slots(flags, [7, 6, 5, -1, 4]) == [7, -1, -1, -1, -1]
    c, prefix = device_seq_tables([0, 17, 17, 40, 100, 116], 116, flags)
    assert c == [0, 17, 17, 40, 100, 116] and prefix == [0, 2, 2, 2, 6, 6]
