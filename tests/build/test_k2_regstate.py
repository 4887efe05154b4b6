"""The register-state K2 (docs/k2_regstate.md) compiles without a spill and fits the CTAs
per SM it is launched for (compile-only, on the CPU; needs the DSL).

Registers are allocated per SM sub-partition: four of 16384, a CTA's warps dealt round-robin over
them (docs/k2_producer.md). A kernel whose state lives in registers must not spill it.
"""

import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is a build-time dependency")
sys.path.append(str(Path(__file__).resolve().parents[2]))

from build_kernels import compile as kc  # noqa: E402
from build_kernels.registry import all_variants  # noqa: E402

REGSTATE = [v for v in all_variants() if v.entry.startswith("k2_regstate")]


def test_every_state_io_is_built():
    # twins of the 7 serial, 2 segmented and 4 state-pool K2 variants at VB=64 and 128, then of the
    # 7 serial and 2 segmented numerics="accurate" ones (the accurate recipe has no state pool)
    flashkda = [v for v in REGSTATE if not dict(v.constants).get("accurate", False)]
    assert len(flashkda) == 2 * (7 + 2 + 4)
    assert len(REGSTATE) - len(flashkda) == 2 * (7 + 2)


def test_accurate_twins_have_the_accurate_k2s_arguments():
    """Each accurate twin takes the arguments and constants of the accurate mma.sync K2 it replaces
    (launcher.k2_kernel_name swaps one name for the other), and only its name ends in _acc."""
    from build_kernels.shared_constants import regstate_name

    mma = {regstate_name(v.name): v for v in all_variants() if v.entry in ("k2_recurrence", "k2_segments")}
    for v in REGSTATE:
        accurate = dict(v.constants).get("accurate", False)
        assert accurate is v.name.endswith("_acc"), v.name
        if accurate:
            twin_of = mma[v.name]
            assert v.args == twin_of.args and v.entry == twin_of.entry.replace("k2_recurrence", "k2_regstate") \
                .replace("k2_segments", "k2_regstate_segments"), v.name
            assert dict(v.constants) == {k: c for k, c in twin_of.constants if k != "ablation"}, v.name


@pytest.mark.parametrize("variant", REGSTATE, ids=lambda v: v.name)
def test_regstate_fits_without_a_spill(tmp_path, variant):
    """One CTA per SM: its warps dealt over the four sub-partitions must fit their 16384 registers at
    the launch count, and, with the producer warpgroup (VB=128), at the counts setmaxnreg trades to:
    per sub-partition one producer warp at PRODUCER_REGS and the rest MMA warps at MMA_REGS."""
    from build_kernels.cubin_info import kernel_resources
    from build_kernels.kernels.k2_regstate import MMA_REGS, PRODUCER_REGS, RegstateConfig

    kc.compile_entry(variant, f" --keep-cubin --keep-ptx --dump-dir {tmp_path}")
    (cubin,) = list(tmp_path.rglob("*.cubin"))
    found = kernel_resources(cubin)
    (registers,) = found["registers"].values()
    frame = next(iter(found["frame_bytes"].values()), 0)
    config = RegstateConfig(dict(variant.constants)["value_block"])
    warps = config.threads // 32
    per_subpartition = -(-warps // 4)  # the sub-partition dealt the most warps
    allocated = -(-registers // 8) * 8  # registers are allocated in units of 8 per thread
    assert frame == 0, f"{variant.name} spills ({frame} bytes of stack)"
    assert per_subpartition * 32 * allocated <= 16384, (variant.name, registers, warps)
    ptx = "\n".join(f.read_text() for f in tmp_path.rglob("*.ptx"))
    if config.producer_warps == 4:
        assert (per_subpartition - 1) * MMA_REGS + PRODUCER_REGS <= per_subpartition * allocated, variant.name
        trades = re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+);", ptx)
        assert sorted(trades) == [("dec", str(PRODUCER_REGS)), ("inc", str(MMA_REGS))], (variant.name, trades)
    else:
        assert "setmaxnreg" not in ptx, variant.name
