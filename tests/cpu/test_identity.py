"""CPU tests of the library identity check (kda_aot/library/identity.py), the generated ABI record
(kda_aot/library/_abi.py) and the alignment table the build writes to the manifest."""

from __future__ import annotations

import copy
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT))  # build_kernels lives only in the source tree (appended: kda_aot stays the installed one)
from build_kernels import abi  # noqa: E402
from build_kernels import shared_constants as build_constants  # noqa: E402
from build_kernels.registry import all_variants, shipped_variants  # noqa: E402
from kda_aot.library import constants, identity, loader  # noqa: E402
from kda_aot.library.abi_hash import abi_hash  # noqa: E402
from kda_aot.intake.validation import ALIGNMENT  # noqa: E402
REVISION = "0123456789ab"


def manifest_for(variants=None, **changes) -> dict:
    """A manifest as build_kernels writes it for `variants` (default: the registry)."""
    variants = all_variants() if variants is None else variants
    kernels = [v.to_json() | {"fingerprint": "f" * 20} for v in variants]
    m = {"format": identity.MANIFEST_FORMAT, "package_version": identity.package_version(),
         "git_revision": REVISION, "abi_hash": abi_hash(kernels),
         # as build_kernels/__main__.py writes it: from the build's own constants
         "constants": build_constants.manifest_constants(),
         "arg_alignment": abi.arg_alignment(variants), "kernels": kernels}
    m.update(changes)
    return m


def expected(revision=REVISION) -> dict:
    return {**identity.expected_identity(), "git_revision": revision}


def check(manifest, revision=REVISION):
    identity.check_library_identity(manifest, "/lib/libkda_kernels.so", expected(revision))


def kernel_index(m, name):
    return next(i for i, k in enumerate(m["kernels"]) if k["name"] == name)


# --------------------------------------------------------------------------------------------
# The package's own record matches the registry

def test_abi_module_is_generated_from_the_registry():
    text = (ROOT / "kda_aot" / "library" / "_abi.py").read_text()
    assert text == abi.render_abi_module(all_variants()), (
        "kda_aot/library/_abi.py is stale: run python -m build_kernels.abi --write")


def test_manifest_alignment_table_is_what_validation_uses():
    assert abi.arg_alignment(all_variants()) == {k: dict(v) for k, v in ALIGNMENT.items()}


def test_package_version_comes_from_pyproject_not_the_manifest():
    version = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert identity.package_version() == version
    import kda_aot

    assert kda_aot.__version__ == version


# --------------------------------------------------------------------------------------------
# Matching and mismatching manifests

def test_matching_manifest_passes():
    check(manifest_for())


def test_revision_not_compared_without_a_stamp():
    check(manifest_for(git_revision="anything"), revision=None)


@pytest.mark.parametrize("changes,match", [
    ({"format": 1}, rf"manifest format 1, but this package reads format {identity.MANIFEST_FORMAT}"),
    ({"format": None}, r"manifest format None"),
    ({"package_version": "9.9.9"}, r"built for kda-aot '9\.9\.9', but this package is kda-aot '[^']+'"),
    ({"git_revision": "fedcba987654"}, rf"built from git revision 'fedcba987654', but this package was built from '{REVISION}'"),
    ({"abi_hash": "0" * 64}, r"the manifest's abi_hash '0{64}' does not match its own kernel list"),
    ({"kernels": None}, r"its manifest's kernel list is malformed"),
])
def test_identity_fields(changes, match):
    with pytest.raises(identity.LibraryMismatchError, match=r"^kernel library /lib/libkda_kernels\.so: " + match):
        check(manifest_for(**changes))


# --------------------------------------------------------------------------------------------
# Constants: declared by the build (build_kernels/shared_constants.py), generated into kda_aot/library/_abi.py,
# recorded in the manifest and checked

def test_the_runtime_reads_the_constants_the_build_declares():
    """The generated copy holds the build's values (and _abi.py is fresh: test_abi_module_is_generated_from_the_registry),
    and the runtime modules read them from kda_aot.library.constants instead of keeping their own."""
    from kda_aot.library import _abi
    from kda_aot.plan import cp_plan, planner, workspace
    from kda_aot.intake import validation

    for name in build_constants.RUNTIME_NAMES:
        assert getattr(_abi, name) == getattr(build_constants, name), name
        assert getattr(constants, name) is getattr(_abi, name), name
    assert constants.manifest_constants() == build_constants.manifest_constants()
    assert planner.D is validation.D is constants.D and planner.CHUNK is cp_plan.CHUNK is constants.CHUNK
    assert planner.VALUE_BLOCKS is constants.VALUE_BLOCKS
    assert workspace.SLOT_BYTES is constants.SLOT_BYTES and workspace.ALIGN is constants.WORKSPACE_ALIGN


def test_manifest_constants_survive_json():
    """The manifest is JSON: what the build writes must compare equal once read back."""
    written = constants.manifest_constants()
    assert json.loads(json.dumps(written)) == written


@pytest.mark.parametrize("name,value", [("CHUNK", 32), ("D", 64), ("VALUE_BLOCKS", [128, 64]),
                                        ("SLOT_BYTES", [["qd", 4096]]), ("STATE_BYTES", 1)])
def test_other_constants_are_refused_naming_both_sides(name, value):
    m = manifest_for()
    want = m["constants"][name]
    m["constants"] = {**m["constants"], name: value}
    with pytest.raises(identity.LibraryMismatchError,
                       match=rf"built with other constants: {name}: the library has {re.escape(repr(value))}, "
                             rf"this package expects {re.escape(repr(want))}"):
        check(m)


def test_a_manifest_without_constants_is_refused():
    m = manifest_for()
    del m["constants"]
    with pytest.raises(identity.LibraryMismatchError, match=r"built with other constants: the library's manifest "
                                                            r"has constants None, this package expects \{'D': 128"):
        check(m)


def test_missing_fields_are_mismatches():
    m = manifest_for()
    del m["abi_hash"]
    with pytest.raises(identity.LibraryMismatchError, match="abi_hash None does not match"):
        check(m)
    with pytest.raises(identity.LibraryMismatchError, match="not a JSON object"):
        check([m])


def edited(mutate, rehash: bool) -> dict:
    """The registry's manifest with k1_prepare's arguments edited; rehash: the editor also
    recomputed abi_hash (else the manifest contradicts itself)."""
    m = copy.deepcopy(manifest_for())
    mutate(m["kernels"][kernel_index(m, "k1_prepare")]["args"])
    if rehash:
        m["abi_hash"] = abi_hash(m["kernels"])
    return m


def swap_q_k(args):
    args[0], args[1] = args[1], args[0]


def retype_beta(args):
    args[3]["dtype"] = "float32"


def realign_dt_bias(args):
    args[5]["align"] = 4


@pytest.mark.parametrize("mutate", [swap_q_k, retype_beta, realign_dt_bias])
def test_edited_kernel_list_contradicts_its_hash(mutate):
    with pytest.raises(identity.LibraryMismatchError, match="does not match its own kernel list"):
        check(edited(mutate, rehash=False))


@pytest.mark.parametrize("mutate,library_side", [
    (swap_q_k, "k1_prepare(k:ptr:bfloat16:16, q:ptr:bfloat16:16, "),
    (retype_beta, "beta:ptr:float32:2"),
    (realign_dt_bias, "dt_bias:ptr:float32:4"),
])
def test_other_abi_names_both_sides(mutate, library_side):
    with pytest.raises(identity.LibraryMismatchError) as info:
        check(edited(mutate, rehash=True))
    msg = str(info.value)
    assert "kernel ABI" in msg and "kernel k1_prepare: " in msg
    library, package = msg.split("the library has ", 1)[1].split(", this package expects ", 1)
    assert library_side in library
    assert "k1_prepare(q:ptr:bfloat16:16, k:ptr:bfloat16:16, g:ptr:bfloat16:16, beta:ptr:bfloat16:2, " \
           "a_log:ptr:float32:4, dt_bias:ptr:float32:16," in package


def test_changed_constant_is_another_abi():
    m = copy.deepcopy(manifest_for())
    m["kernels"][kernel_index(m, "k2_in_f32_vb64")]["constants"]["value_block"] = 128
    m["abi_hash"] = abi_hash(m["kernels"])
    with pytest.raises(identity.LibraryMismatchError, match=r'k2_in_f32_vb64\(.*"value_block":128\}, this package expects'):
        check(m)


# --------------------------------------------------------------------------------------------
# The lattice: a library holds every shipped kernel, nothing outside all variants, each with this
# package's signature (build_kernels/registry.py shipped_variants; docs/build.md, "Kernel lattice")

def test_the_shipped_lattice_and_all_variants_are_both_accepted():
    shipped = shipped_variants()
    assert 0 < len(shipped) < len(all_variants())
    check(manifest_for(variants=shipped))
    check(manifest_for())


def test_the_shipped_names_are_the_registrys():
    from kda_aot.library import _abi

    assert _abi.SHIPPED == {v.name for v in shipped_variants()}
    assert _abi.SHIPPED <= {sig.split("(", 1)[0] for sig in _abi.SIGNATURES}


def test_any_measurement_only_kernels_may_be_present():
    """A library of the shipped lattice plus some measurement-only kernels (a --only build, an older
    lattice) is accepted: each kernel is checked by its own signature."""
    names = {v.name for v in shipped_variants()}
    extra = [v for v in all_variants() if v.name not in names][:3]
    check(manifest_for(variants=shipped_variants() + extra))
    check(manifest_for(variants=all_variants()[:-1]))  # all but the last ablation


@pytest.mark.parametrize("name", ["k1_prepare", "k2_regstate_inout_bf16_vb64", "k2_inout_f32_vb32", "approx_ex2"])
def test_a_missing_shipped_kernel_is_refused(name):
    m = manifest_for(variants=[v for v in shipped_variants() if v.name != name])
    with pytest.raises(identity.LibraryMismatchError, match=rf"kernel ABI differs from this package's: kernel {name}: "
                                                            rf"the library lacks it, this package ships it as {name}\("):
        check(m)


def test_an_unknown_kernel_is_refused():
    import dataclasses

    base = next(v for v in all_variants() if v.name == "k2_inout_bf16_vb32")
    stranger = dataclasses.replace(base, name="k2_inout_bf16_vb16", constants=base.constants)
    m = manifest_for(variants=shipped_variants() + [stranger])
    with pytest.raises(identity.LibraryMismatchError, match=r"kernel k2_inout_bf16_vb16: the library has "
                                                            r"k2_inout_bf16_vb16\(.*this package has no such kernel"):
        check(m)


@pytest.mark.parametrize("name", ["k2_regstate_in_f32_vb128", "k2_in_f32_vb64", "k2_inout_bf16_vb64_acc_l2"])
def test_a_kernel_of_another_signature_is_refused_shipped_or_not(name):
    m = copy.deepcopy(manifest_for())
    m["kernels"][kernel_index(m, name)]["args"][0]["align"] = 8
    m["abi_hash"] = abi_hash(m["kernels"])
    with pytest.raises(identity.LibraryMismatchError, match=rf"kernel {name}: the library has {name}\(v:ptr:bfloat16:8, "
                                                            rf".*this package expects {name}\(v:ptr:bfloat16:16, "):
        check(m)


def test_a_kernel_listed_twice_is_refused():
    twice = next(v for v in all_variants() if v.name == "k1_prepare")
    with pytest.raises(identity.LibraryMismatchError, match="kernel k1_prepare: the library lists it 2 times"):
        check(manifest_for(variants=shipped_variants() + [twice]))


def test_the_kernel_order_is_not_part_of_the_abi():
    """The runtime finds kernels by name in the library's own manifest, and the hash sorts them by
    name: a build that lists its kernels in another order is the same ABI."""
    m = manifest_for(variants=list(reversed(all_variants())))
    assert m["abi_hash"] == manifest_for()["abi_hash"]
    check(m)


def test_fingerprint_and_entry_are_not_part_of_the_abi():
    m = copy.deepcopy(manifest_for())
    for k in m["kernels"]:
        k["fingerprint"], k["entry"] = "other", "other_entry"
    check(m)


# --------------------------------------------------------------------------------------------
# The loader runs the check; KDA_AOT_LIB_DIR must be absolute

def test_relative_lib_dir_is_refused(monkeypatch):
    monkeypatch.setenv(loader.LIB_DIR_ENV, "build/lib")
    with pytest.raises(loader.LibraryNotFoundError, match="^KDA_AOT_LIB_DIR: must be an absolute path, got 'build/lib'"):
        loader.library_dir()
    monkeypatch.setenv(loader.LIB_DIR_ENV, "/abs/dir")
    assert loader.library_dir() == Path("/abs/dir")
    monkeypatch.delenv(loader.LIB_DIR_ENV)
    assert loader.library_dir() == loader.LIB_DIR


def built_library() -> Path:
    """A built libkda_kernels.so to load (KDA_AOT_LIB_DIR's, else the packaged one), or skip."""
    try:
        directory = loader.library_dir()
    except loader.KdaError:
        directory = loader.LIB_DIR
    path = directory / loader.LIB_NAME
    if not path.exists():
        pytest.skip("no built kernel library here")
    return path


def test_loader_refuses_a_hand_edited_manifest(tmp_path, monkeypatch):
    """The real library with a manifest made for this package loads; the same manifest with
    another version does not (identity is checked before the library is even opened)."""
    lib = built_library()
    shipped = json.loads((lib.parent / loader.MANIFEST_NAME).read_text())
    names = [k["name"] for k in shipped["kernels"]]
    variants = next((lattice for lattice in (shipped_variants(), all_variants())
                     if names == [v.name for v in lattice]), None)
    if variants is None:
        pytest.skip("the built library is from another registry")
    shutil.copy(lib, tmp_path / loader.LIB_NAME)
    m = manifest_for(variants=variants, git_revision=shipped["git_revision"])
    monkeypatch.setattr(identity, "package_revision", lambda: shipped["git_revision"])
    (tmp_path / loader.MANIFEST_NAME).write_text(json.dumps(m))
    assert list(loader.KernelLibrary(tmp_path).kernels) == names
    (tmp_path / loader.MANIFEST_NAME).write_text(json.dumps({**m, "package_version": "0.0.1"}))
    with pytest.raises(identity.LibraryMismatchError, match=r"built for kda-aot '0\.0\.1'"):
        loader.KernelLibrary(tmp_path)
