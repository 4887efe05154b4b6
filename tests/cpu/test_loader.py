"""The installed library: loads anywhere, matches its manifest, exports only the shim, needs only libc."""

import re
import shutil
import subprocess

import pytest

import kda_aot
from kda_aot.library import identity, loader


def test_library_matches_manifest():
    lib = loader.get_library()
    manifest = lib.manifest
    assert manifest["format"] == identity.MANIFEST_FORMAT
    assert manifest["arch"] == "sm_90a"
    assert manifest["dsl_version"] == "4.8.1"
    assert manifest["package_version"] == kda_aot.__version__
    assert [k["name"] for k in manifest["kernels"]] == list(lib.kernels)
    assert {"seq_tables_int32", "seq_tables_int64", "seq_tables_dense"} <= set(lib.kernels)


def test_info_reports_build_and_devices():
    info = kda_aot.info()
    assert set(info) <= {"version", "library", "flavour", "dsl_version", "git_revision", "kernel_count",
                         "devices", "device_error"}, "info() is the compact summary; the manifest is full=True's"
    assert info["version"] == kda_aot.__version__
    assert info["library"].endswith("libkda_kernels.so")
    assert info["flavour"] in ("cu12", "cu13")
    assert info["kernel_count"] == len(loader.get_library().kernels)
    assert isinstance(info["devices"], int)
    if info["devices"] == 0:
        assert "CUDA error" in info["device_error"]


def test_info_full_adds_the_manifest():
    info = kda_aot.info(full=True)
    assert info["manifest"]["cuda_flavour"] == info["flavour"]
    assert info["manifest"]["git_revision"] == info["git_revision"]
    assert info["kernels"] == sorted(k["name"] for k in info["manifest"]["kernels"])
    assert len(info["kernels"]) == info["kernel_count"]


def test_info_says_when_there_is_no_driver(no_cuda_driver):
    """Without libcuda the runtime's error 35 reads 'driver version is insufficient'; info() must say
    that no driver was found instead (and keep the CUDA error for scripts)."""
    info = kda_aot.info()
    assert info["devices"] == 0
    assert info["device_error"].startswith("no NVIDIA driver found"), info["device_error"]
    assert "CUDA error 35" in info["device_error"]


def test_no_driver_gives_a_clear_error():
    lib = loader.get_library()
    try:
        count = lib.device_count()
    except loader.CudaError as exc:
        assert exc.code in (35, 100, 999, 3)  # insufficient driver / no device / unknown / init
        assert "querying CUDA devices" in str(exc) and exc.cuda_name.startswith("cuda")
        with pytest.raises(loader.CudaError, match=r"loading kernel seq_tables_int32: .*CUDA error"):
            lib.kernel("seq_tables_int32")(0, 0, 0, 0, 1, 0, 0)
    else:
        pytest.skip(f"a driver is present ({count} devices)")


def test_kernel_call_checks_argument_count():
    k = loader.get_library().kernel("seq_tables_dense")
    with pytest.raises(TypeError, match="seq_tables_dense takes 5 arguments"):
        k(0, 0, 1)


def test_unknown_kernel_is_named():
    with pytest.raises(loader.KdaError, match="kernel nope is not in this build"):
        loader.get_library().kernel("nope")


def test_missing_library_is_explained(tmp_path):
    with pytest.raises(loader.LibraryNotFoundError, match="libkda_kernels.so"):
        loader.KernelLibrary(tmp_path)


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf not installed")
def test_library_needs_only_libc():
    out = subprocess.run(["readelf", "-d", str(loader.get_library().path)], capture_output=True, text=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out)
    assert needed, out
    allowed = re.compile(r"^(libc|libm|libdl|librt|libpthread|ld-linux-x86-64)\.so")
    assert all(allowed.match(n) for n in needed), needed


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm not installed")
def test_library_exports_only_the_shim():
    out = subprocess.run(["nm", "-D", "--defined-only", str(loader.get_library().path)],
                         capture_output=True, text=True).stdout
    symbols = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert symbols == {"kda_kernel_count", "kda_kernel_name", "kda_error_string", "kda_error_name",
                       "kda_device_count", "kda_set_device", "kda_get_device", "kda_load", "kda_launch",
                       "kda_run", "kda_xla_prefill"}
