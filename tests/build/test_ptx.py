"""Compile-only checks of the kernels' PTX, on the CPU (needs the DSL; skipped without it).

What a hang or a silent slowdown would otherwise hide (docs/build.md §3):
every non-tensor bulk copy is issued under an elect.sync (an un-elected global->shared bulk copy
deadlocks on DSL 4.8.x), nothing spills to local memory, and the intended instructions are there.
"""

import importlib
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is a build-time dependency")
REPO = Path(__file__).resolve().parents[2]
sys.path.append(str(REPO))  # build_kernels lives only in the source tree (appended: kda_aot stays the installed one)

from build_kernels import compile as kc  # noqa: E402
from build_kernels.registry import all_variants  # noqa: E402

BULK = re.compile(r"cp\.async\.bulk\.(?:shared::cluster\.global|global\.shared::cta)")


def _representatives():
    """One variant per kernel entry (the first), plus the K2 value-block extremes."""
    chosen, seen = [], set()
    for v in all_variants():
        key = v.entry if v.entry != "k2_recurrence" else (v.entry, dict(v.constants).get("value_block"))
        if key not in seen:
            seen.add(key)
            chosen.append(v)
    return chosen


@pytest.fixture(scope="module")
def ptx_of(tmp_path_factory):
    cache = {}

    def compile_ptx(variant):
        if variant.name not in cache:
            out = tmp_path_factory.mktemp(variant.name)
            kc.compile_entry(variant, f" --keep-ptx --dump-dir {out}")
            files = list(Path(out).rglob("*.ptx"))
            assert files, f"no PTX dumped for {variant.name}"
            cache[variant.name] = "\n".join(f.read_text() for f in files)
        return cache[variant.name]

    return compile_ptx


@pytest.mark.parametrize("variant", _representatives(), ids=lambda v: v.name)
def test_no_local_memory(ptx_of, variant):
    ptx = ptx_of(variant)
    assert not re.search(r"\b(ld|st)\.local\b", ptx), f"{variant.name} spills to local memory"


@pytest.mark.parametrize("variant", _representatives(), ids=lambda v: v.name)
def test_every_bulk_copy_is_elected(ptx_of, variant):
    """Each raw bulk-copy instruction must sit in a block entered through elect.sync."""
    ptx = ptx_of(variant)
    lines = ptx.splitlines()
    for i, line in enumerate(lines):
        if BULK.search(line) and "tensor" not in line:
            window = "\n".join(lines[max(0, i - 40):i])
            assert "elect.sync" in window, f"{variant.name}: un-elected bulk copy at PTX line {i}: {line.strip()}"


def test_kernels_use_tensor_cores_and_fast_math(ptx_of):
    by_entry = {v.entry: v for v in _representatives()}
    ptx = ptx_of(by_entry["k1_prepare"])
    assert "mma.sync.aligned.m16n8k16" in ptx
    assert "ex2.approx.ftz.f32" in ptx and "tanh.approx.f32" in ptx
    assert "mma.sync.aligned.m16n8k16" in ptx_of(by_entry["k2_recurrence"])


@pytest.mark.parametrize("variant", [v for v in _representatives() if not v.entry.startswith("approx")],
                         ids=lambda v: v.name)
def test_prefill_kernels_wait_for_the_previous_grid_first(ptx_of, variant):
    """Launched with programmatic dependent launch, a kernel may start while its predecessor runs:
    griddepcontrol.wait must come before the first global memory access (kernel_abi.md)."""
    ptx = ptx_of(variant)
    body = ptx[ptx.index(".entry"):]
    wait = body.find("griddepcontrol.wait")
    assert wait >= 0, f"{variant.name}: no griddepcontrol.wait"
    accesses = [m.start() for m in re.finditer(r"\b(?:ld|st|atom|red)(?:\.\w+)*\.global\b|cp\.async\S*global", body)]
    assert not accesses or wait < min(accesses), f"{variant.name}: global access before griddepcontrol.wait"
    assert "griddepcontrol.launch_dependents" not in body  # no early trigger (tile_ops.await_previous_grid)


# The serial accurate VB=128 K2 needs two CTAs per SM to keep up with the default one, which is
# why its MMA warps produce the tiles themselves (k2_recurrence.K2Config.folded_producer,
# docs/k2_producer.md). Registers are allocated per SM sub-partition (four of 16384, a CTA's warps
# dealt round-robin over them), so two 8-warp CTAs fit at up to 128 registers per thread.
TWO_CTAS_MAX_REGISTERS = 128


def _cubin_resources(tmp_path, variant):
    from build_kernels.cubin_info import kernel_resources

    kc.compile_entry(variant, f" --keep-cubin --keep-ptx --dump-dir {tmp_path}")
    cubins = list(tmp_path.rglob("*.cubin"))
    assert len(cubins) == 1, cubins
    found = kernel_resources(cubins[0])
    assert len(found["registers"]) == 1, found
    return next(iter(found["registers"].values())), next(iter(found["frame_bytes"].values()), 0)


def _k2_mode(variant):
    """(value_block, accurate, segmented) of a K2 variant (serial, segmented or state pool), else None:
    the leading fields of k2_recurrence.K2Config, on which its folded_producer, threads and min_ctas depend."""
    if variant.entry not in ("k2_recurrence", "k2_segments", "k2_ext"):
        return None
    constants = dict(variant.constants)
    segmented = variant.entry == "k2_segments" or constants.get("segments", False)
    return constants["value_block"], constants.get("accurate", False), segmented


def _folded(variant) -> bool:
    from build_kernels.kernels.k2_recurrence import K2Config

    mode = _k2_mode(variant)
    return mode is not None and K2Config(*mode).folded_producer


FOLDED = [v for v in all_variants() if _folded(v)]


def test_the_folded_producer_is_the_serial_accurate_vb128_recurrence():
    assert {v.name for v in FOLDED} == {v.name for v in all_variants() if v.entry == "k2_recurrence"
                                        and v.name.endswith("_vb128_acc")}


@pytest.mark.parametrize("variant", FOLDED, ids=lambda v: v.name)
def test_folded_recurrence_fits_two_ctas_per_sm(tmp_path, variant):
    """Read from the cubin ptxas made (build_kernels/cubin_info.py): 256 threads, at most 128
    registers, no spill (a spill needs a stack frame)."""
    registers, frame = _cubin_resources(tmp_path, variant)
    assert registers <= TWO_CTAS_MAX_REGISTERS and frame == 0, (variant.name, registers, frame)
    assert ".reqntid 256, 1, 1" in "\n".join(f.read_text() for f in tmp_path.rglob("*.ptx"))


def _min_ctas(variant):
    from build_kernels.kernels.k2_recurrence import K2Config

    mode = _k2_mode(variant)
    return None if mode is None else K2Config(*mode).min_ctas


HINTED = [v for v in all_variants() if _min_ctas(v)]


def test_the_default_recipe_k2_at_vb128_and_vb64_carries_an_occupancy_hint():
    names = {v.name for v in HINTED}
    assert names and all("_acc" not in n and ("_vb128" in n or "_vb64" in n) for n in names), names
    assert "k2_inout_bf16_vb64" in names and "k2_segments_f32_vb128" in names and "k2_ext_bf16_vb64" in names


# The two mma.sync K2 variants with an initial and no final state at VB=128 spill 4 bytes (an 8-byte
# frame) at the two-CTA budget of 96 registers since v's token and head strides became kernel
# arguments; ptxas keeps their inout, out and nostate siblings spill-free. The planner never
# launches them: their register-state twins run every such call (docs/k2_regstate.md); only
# KDA_K2_KERNEL=k2 reaches them, for comparisons. The bound keeps a larger spill from passing.
SPILL_ALLOWED = {"k2_in_bf16_vb128": 8, "k2_in_f32_vb128": 8}


@pytest.mark.parametrize("variant", HINTED, ids=lambda v: v.name)
def test_hinted_recurrence_fits_the_ctas_it_promises(tmp_path, variant):
    """A K2 variant launched with min_blocks_per_mp = N (k2_recurrence.K2Config.min_ctas, docs/k2_schedule.md)
    must still fit N CTAs per SM with registers allocated per SM sub-partition: ceil(N * warps / 4)
    warps on the fullest of the four, 16384 registers each, a warp's registers in units of 256.
    And no spill beyond SPILL_ALLOWED. Read from the cubin ptxas made."""
    from build_kernels.kernels.k2_recurrence import K2Config

    n = _min_ctas(variant)
    registers, frame = _cubin_resources(tmp_path, variant)
    warps = K2Config(*_k2_mode(variant)).threads // 32
    per_warp = -(-registers * 32 // 256) * 256
    assert -(-n * warps // 4) * per_warp <= 16384, (variant.name, registers, frame)
    assert frame <= SPILL_ALLOWED.get(variant.name, 0), (variant.name, registers, frame)
    assert f".minnctapersm {n}" in "\n".join(f.read_text() for f in tmp_path.rglob("*.ptx"))


def test_cubin_reader_sees_a_spill(tmp_path):
    """The reader's negative control: CP pre_scan at VB=128 is known to spill a few bytes
    (docs/numerics.md, registers), so its frame is not empty."""
    variant = next(v for v in all_variants() if v.name == "cp_pre_scan_vb128")
    registers, frame = _cubin_resources(tmp_path, variant)
    assert registers > TWO_CTAS_MAX_REGISTERS and frame > 0, (registers, frame)


def test_ptx_check_finds_identical_and_changed_kernels(tmp_path, capsys):
    """The refactor check (build_kernels.ptx_check): a saved set compares identical, an edit is caught."""
    from build_kernels import ptx_check

    only = ["seq_tables_dense", "approx_ex2"]
    assert ptx_check.main(["--save", str(tmp_path), "--only", *only]) == 0
    assert ptx_check.main(["--compare", str(tmp_path), "--only", *only]) == 0
    saved = tmp_path / "approx_ex2.ptx"
    saved.write_text(saved.read_text().replace("ex2.approx", "ex2.approx.changed", 1))
    assert ptx_check.main(["--compare", str(tmp_path), "--only", *only]) == 1
    assert "differ: approx_ex2" in capsys.readouterr().out


def test_registry_arguments_are_the_host_entries_parameters():
    """The manifest's argument list of every variant (names and order) is its host entry's
    parameter list less the compile-time constants (a kernel class's: its __call__'s less self): the
    runtime matches arguments by these names."""
    import inspect

    for variant in all_variants():
        module = importlib.import_module(f"build_kernels.kernels.{variant.module}")
        entry = getattr(module, variant.entry)
        if isinstance(entry, type):
            entry = entry.__call__
        params = [p for p in inspect.signature(getattr(entry, "__wrapped__", entry)).parameters if p != "self"]
        constants = {name for name, _ in variant.constants}
        assert [p for p in params if p not in constants] == [a.name for a in variant.args], variant.name


def _entry_param_count(ptx: str) -> int:
    """The .param declarations of the PTX's (one) kernel entry."""
    (params,) = re.findall(r"^\.visible \.entry \w+\((.*?)\)", ptx, flags=re.M | re.S)
    return len(re.findall(r"\.param ", params))


# K2Params fields that only the ext (state pool / checkpoint) K2 passes.
_K2_EXT_ONLY = {"idx_ptr", "slot_stride", "n_pool", "ck_ptr", "ck_every", "mSeqStart", "n_real", "ck_tab", "ck_k",
                "ck_stride"}


def _k2_fields_passed(variant) -> set:
    from build_kernels.kernels.common.recurrence_common import K2Params

    c = dict(variant.constants)
    absent = set()
    if "ext" not in variant.entry:
        absent |= _K2_EXT_ONLY
        if "segments" in variant.entry:
            absent.add("order_ptr")  # segments run in order
        else:
            absent.add("mSlot")
            if not c.get("has_initial", True):
                absent.add("init_ptr")
            if not c.get("has_final", True):
                absent.add("final_ptr")
    return set(K2Params._fields) - absent


K2_PARAM_CASES = [v for v in all_variants() if v.entry.startswith("k2_") and v.name in {
    "k2_regstate_nostate_vb128", "k2_regstate_in_bf16_vb64", "k2_regstate_out_f32_vb128", "k2_inout_f32_vb64",
    "k2_regstate_segments_f32_vb128", "k2_segments_bf16_vb32", "k2_regstate_ext_f32_vb128",
    "k2_ext_segments_bf16_vb64"}]


@pytest.mark.parametrize("variant", K2_PARAM_CASES, ids=lambda v: v.name)
def test_k2_kernel_parameters_are_what_its_mode_passes(ptx_of, variant):
    """What a K2 mode or variant has not (the pool and checkpoint arguments outside k2_ext,
    final_slot outside a segmented K2, seq_order in one, an unread entry / exit state) is a
    compile-time None (recurrence_common.k2_params), left out of the kernel's .param list: one
    .param per K2Params field passed, tensors included."""
    assert len(K2_PARAM_CASES) == 8
    assert _entry_param_count(ptx_of(variant)) == len(_k2_fields_passed(variant)), variant.name


@pytest.mark.parametrize("name,barriers", [("k1_prepare", "K1Barrier"), ("k1x_softplus_logits2_bf16", "K1Barrier"),
                                           ("cp_merge_bf16", "MergeBarrier")])
def test_named_barriers_are_the_kernels_cta_syncs(ptx_of, name, barriers):
    """K1's and the merge's CTA barriers are their module's named barriers (tile_ops.sync_named):
    each id of the enum that the kernel reaches is one bar.sync of all its threads, and none is the
    anonymous barrier 0. The general K1 reaches all four (B3 only there)."""
    variant = next(v for v in all_variants() if v.name == name)
    module = importlib.import_module(f"build_kernels.kernels.{variant.module}")
    enum = getattr(module, barriers)
    syncs = re.findall(r"\bbar(?:rier)?\.sync(?:\.aligned)?\s+(\d+)(?:,\s*(\d+))?;", ptx_of(variant))
    ids = sorted(int(i) for i, _ in syncs)
    expected = sorted(int(b) for b in enum if name != "k1_prepare" or b is not enum.WIDE_PRODUCTS)
    assert ids == expected, (name, syncs)
    assert {int(n) for _, n in syncs} == {module.THREADS}, syncs
