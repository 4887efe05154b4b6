"""ci/ncu_limits.py reads Nsight Compute's raw CSV (base units) into per-kernel floors."""

import importlib.util
from pathlib import Path

SAMPLE = '''# shape 64 8192
==PROF== Connected to process 123
"ID","Process ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum","dram__bytes_write.sum","dram__throughput.avg.pct_of_peak_sustained_elapsed","sm__throughput.avg.pct_of_peak_sustained_elapsed","launch__grid_size","sm__warps_active.avg.pct_of_peak_sustained_active"
"","","","nsecond","byte","byte","%","%","",""
"0","123","kernel_cutlass_k1_prepare_0(int)","213000","426,000,000","426000000","80","30","4096","50"
"1","123","kernel_cutlass_k2_out(int)","500000","426000000","0","20","40","512","25"
# shape 4 8192
"ID","Process ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum","dram__bytes_write.sum","dram__throughput.avg.pct_of_peak_sustained_elapsed","sm__throughput.avg.pct_of_peak_sustained_elapsed","launch__grid_size","sm__warps_active.avg.pct_of_peak_sustained_active"
"","","","nsecond","byte","byte","%","%","",""
'''


def _module():
    path = Path(__file__).resolve().parents[2] / "ci" / "ncu_limits.py"
    spec = importlib.util.spec_from_file_location("ncu_limits", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_floor_and_ratio_per_kernel():
    text = _module().table(SAMPLE, 4.26)
    rows = [line for line in text.splitlines() if line.startswith("| 64")]
    assert "| k1_prepare_0 | 4096 | 213.0 | 852.0 | 200.0 | 1.06 |" in rows[0]
    assert "| k2_out | 512 | 500.0 | 426.0 | 100.0 | 5.00 |" in rows[1]
    assert "**all kernels** | | 713.0 | | 300.0 | 2.38 |" in rows[2]
    # a shape whose ncu run produced no kernel rows still gets its total line, not a crash
    assert any(line.startswith("| 4, [8192] | **all kernels** | | 0.0") for line in text.splitlines())
