"""Host-side launch planning on the CPU: CP tables and workspace layout, and the capture fallback."""

import numpy as np
import pytest

from kda_aot import api, cp_plan, launcher, planner
from kda_aot.validation import Problem
from kda_aot.workspace import workspace_layout


def _regions_disjoint_and_aligned(layout):
    spans = sorted((off, off + n, name) for name, (off, n) in layout.regions.items())
    for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
        assert a1 <= b0, f"{an} overlaps {bn}"
    assert all(off % 256 == 0 for off, _ in layout.regions.values())
    assert spans[-1][1] <= layout.nbytes


@pytest.mark.parametrize("H,cap,N", [(1, 1, 1), (64, 518, 6), (4, 0, 3)])
def test_workspace_layout(H, cap, N):
    layout = workspace_layout(H, cap, N)
    _regions_disjoint_and_aligned(layout)
    assert layout.regions["qd"][1] == H * cap * 4096 and layout.regions["tile_prefix"][1] == 4 * (N + 1)


@pytest.mark.parametrize("lens,H,mode", [([8192], 4, "auto"), ([8192, 2048], 8, "auto"), ([1000, 17, 0, 513], 2, 4),
                                         ([14336] + [128] * 16, 8, "auto")])
def test_cp_launch_tables_match_the_plan(lens, H, mode):
    plan = cp_plan.plan_prefill(lens, H, sm_count=132, mode=mode)
    assert not plan.trivial
    cap = planner.tile_capacity(sum(lens), plan.n_segments, True)
    launch = launcher.cp_launch(plan, H, cap)
    _regions_disjoint_and_aligned(launch.layout)
    blob = launch.blob
    n_seg = plan.n_segments

    def table(name, count):
        start = launch.table_offsets[name] // 4
        return blob[start:start + count].tolist()

    seg_start, seg_prefix = cp_plan.segment_tables(plan)
    assert table("seg_start", n_seg + 1) == list(seg_start)
    assert table("seg_prefix", n_seg + 1) == list(seg_prefix)
    slots = table("final_slot", n_seg)
    assert slots == cp_plan.final_slots(plan)
    assert [slots.index(n) for n in range(len(lens))] == cp_plan.last_segments(plan)  # one writer per sequence
    assert sum(s >= 0 for s in slots) == len(lens) and "seg_final" not in launch.layout.regions
    assert table("seg_first", len(lens)) == [f for f, _ in plan.per_seq]
    assert table("seg_count", len(lens)) == [c for _, c in plan.per_seq]
    assert launch.n_scan == len(cp_plan.non_last_segments(plan))
    assert table("scan_seg", launch.n_scan) == cp_plan.non_last_segments(plan, longest_first=True)
    assert launch.layout.regions["b_seg"][1] == n_seg * H * 128 * 128 * 4
    assert blob.dtype == np.int32 and not blob.flags.writeable
    assert launcher.cp_launch(plan, H, cap) is launch  # computed once per shape


def _problem(cp):
    return Problem(B=1, T=4096, H=4, N=1, varlen=True, cu_dtype="int32", state_dtype=None, has_initial=False,
                   has_final=False, scale=128 ** -0.5, lower_bound=-5.0, device_id=0, cp=cp)


def test_capture_without_lengths_runs_serial_and_says_why():
    with pytest.warns(RuntimeWarning, match="CUDA graph capture"):
        assert api._plan(_problem("auto"), None, 132, 0, lib=None) is None
    with pytest.raises(ValueError, match="^cp: 'on' needs the sequence lengths"):
        api._plan(_problem("on"), None, 132, 0, lib=None)
    assert api._plan(_problem("off"), None, 132, 0, lib=None) is None


def test_gate_constant_is_formed_in_double_and_rounded_once():
    assert launcher.gate_constant(-5.0) == float(np.float32(-5.0 * 1.4426950408889634))
