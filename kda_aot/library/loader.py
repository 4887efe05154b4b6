"""Find and load the kernel library once per process; turn CUDA errors into Python exceptions.

The library exposes a handful of C functions (build_kernels/shim/kda_shim.c): kernel i is
loaded with kda_load(i) and launched with kda_launch(i, args, n), where args points to the
argument values in the order the manifest lists them. The manifest is the build's description of
every kernel; the loader refuses a library whose kernels do not match it.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..errors import CUDA_ERROR_INSUFFICIENT_DRIVER, CudaError, KdaError, LibraryNotFoundError  # noqa: F401 (re-exported)
from .identity import check_library_identity

LIB_DIR = Path(__file__).resolve().parents[1] / "_lib"  # kda_aot/_lib
LIB_NAME = "libkda_kernels.so"
MANIFEST_NAME = "manifest.json"
# An explicit build directory (holding the library and manifest) wins over the packaged one:
# used by development builds and the device scripts.
LIB_DIR_ENV = "KDA_AOT_LIB_DIR"
# How to get the measurement-only kernels (the mma.sync K2 where a register-state twin exists, the
# accurate recipe's ablations), which the shipped lattice leaves out (docs/build.md, "Kernel lattice").
MEASUREMENT_BUILD = ("Build a library of every variant, with the measurement-only kernels (KDA_KERNEL_LATTICE=all "
                     "bash ci/build_wheels.sh cu12 and install that wheel, or KDA_KERNEL_LATTICE=all pip install .; "
                     f"docs/build.md), or point {LIB_DIR_ENV} at the directory of such a library")


_CTYPES = {"i32": ctypes.c_int32, "i64": ctypes.c_int64, "f32": ctypes.c_float}


class Kernel:
    """One exported kernel variant: call it with values in manifest order (stream last)."""

    def __init__(self, library: "KernelLibrary", index: int, spec: dict):
        self.library = library
        self.index = index
        self.name: str = spec["name"]
        self.entry: str = spec.get("entry", "")
        self.args: List[dict] = spec["args"]
        self.constants: dict = spec.get("constants", {})
        self._devices: set = set()  # devices this kernel is loaded on (kda_load, per device on demand)
        # ctypes boxing per argument, decided once: calls sit on the host's critical path
        self._boxers = [ctypes.c_void_p if a["kind"] in ("ptr", "stream") else _CTYPES[a["kind"]] for a in self.args]
        self._argv_type = ctypes.c_void_p * len(self.args)

    def __repr__(self) -> str:
        return f"Kernel({self.name})"

    def ensure_loaded(self, device_id: Optional[int] = None) -> None:
        """Load on `device_id` (default: the thread's current device) unless done already; only the
        devices a call runs on are loaded, so a GPU this build cannot run on is never touched."""
        if device_id is None:
            device_id = self.library.current_device(f"loading kernel {self.name}: querying the current device")
        if device_id in self._devices:
            return
        with self.library._lock:
            if device_id not in self._devices:
                self.library._check(self.library._lib.kda_load(self.index, device_id),
                                    f"loading kernel {self.name} on device {device_id}")
                self._devices.add(device_id)

    def __call__(self, *values) -> None:
        self.launch(self.prepare(*values))

    def prepare(self, *values) -> tuple:
        """Box the arguments once; `launch` may then run the same prepared call many times."""
        if len(values) != len(self.args):
            raise TypeError(f"kernel {self.name} takes {len(self.args)} arguments "
                            f"({', '.join(a['name'] for a in self.args)}), got {len(values)}")
        boxed = [box(value or 0) for box, value in zip(self._boxers, values)]
        return self._argv_type(*[ctypes.addressof(b) for b in boxed]), boxed

    def launch(self, prepared: tuple) -> None:
        self.ensure_loaded()  # direct launches (tests, tools) run on the thread's current device
        argv, boxed = prepared
        code = self.library._lib.kda_launch(self.index, argv, len(boxed))
        if code:
            self.library._check(code, f"kernel {self.name}")


class KernelLibrary:
    """The loaded shared library and its manifest."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.path = self.directory / LIB_NAME
        manifest_path = self.directory / MANIFEST_NAME
        if not self.path.exists() or not manifest_path.exists():
            raise LibraryNotFoundError(
                f"kda-aot kernel library not found in {self.directory} (expected {LIB_NAME} and {MANIFEST_NAME}); "
                "install a built wheel or build from source with `pip install .`")
        self.manifest: dict = json.loads(manifest_path.read_text())
        check_library_identity(self.manifest, self.path)
        self._lock = threading.Lock()
        self._lib = ctypes.CDLL(str(self.path))
        # kda_run is called through PyDLL, which keeps the GIL for the call: one prefill's launches
        # then reach the stream together, never interleaved with another thread's.
        self._run = ctypes.PyDLL(str(self.path)).kda_run
        self._declare()
        self.kernels: Dict[str, Kernel] = {}
        count = self._lib.kda_kernel_count()
        specs = self.manifest["kernels"]
        if count != len(specs):
            raise KdaError(f"{self.path}: library has {count} kernels, manifest lists {len(specs)}: stale build")
        for i, spec in enumerate(specs):
            name = self._lib.kda_kernel_name(i).decode()
            if name != spec["name"]:
                raise KdaError(f"{self.path}: kernel {i} is {name}, manifest says {spec['name']}: stale build")
            self.kernels[name] = Kernel(self, i, spec)

    def _declare(self) -> None:
        lib = self._lib
        lib.kda_kernel_count.restype = ctypes.c_int32
        lib.kda_kernel_name.restype = ctypes.c_char_p
        lib.kda_kernel_name.argtypes = [ctypes.c_int32]
        lib.kda_error_string.restype = ctypes.c_char_p
        lib.kda_error_string.argtypes = [ctypes.c_int32]
        lib.kda_error_name.restype = ctypes.c_char_p
        lib.kda_error_name.argtypes = [ctypes.c_int32]
        lib.kda_device_count.restype = ctypes.c_int32
        lib.kda_device_count.argtypes = [ctypes.POINTER(ctypes.c_int32)]
        lib.kda_set_device.restype = ctypes.c_int32
        lib.kda_set_device.argtypes = [ctypes.c_int32]
        lib.kda_load.restype = ctypes.c_int32
        lib.kda_load.argtypes = [ctypes.c_int32, ctypes.c_int32]
        lib.kda_get_device.restype = ctypes.c_int32
        lib.kda_get_device.argtypes = [ctypes.POINTER(ctypes.c_int32)]
        lib.kda_launch.restype = ctypes.c_int32
        lib.kda_launch.argtypes = [ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int32]
        self._run.restype = ctypes.c_int32
        self._run.argtypes = [ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32,
                              ctypes.c_char_p, ctypes.c_int32]

    def run(self, device_id: int, steps_ptr: int, n_steps: int, slots_ptr: int, n_slots: int, inputs: bytes,
            n_inputs: int) -> int:
        """kda_run (build_kernels/shim/kda_shim.c): 0, or the failing step's CUDA error | step << 16."""
        return self._run(device_id, steps_ptr, n_steps, slots_ptr, n_slots, inputs, n_inputs)

    def xla_handler(self):
        """kda_xla_prefill (build_kernels/shim/kda_xla.c), the XLA FFI handler of kda_aot.jax, as a
        ctypes function pointer into this loaded library (jax.ffi.pycapsule wraps it)."""
        return self._lib.kda_xla_prefill

    def raise_run_error(self, code: int, kernel_names) -> None:
        step, err = code >> 16, code & 0xFFFF
        name = kernel_names[step] if 0 <= step < len(kernel_names) else f"step {step}"
        self._check(err, f"kernel {name}")

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            raise CudaError(what, code, self._lib.kda_error_name(code).decode(),
                            self._lib.kda_error_string(code).decode())

    def kernel(self, name: str) -> Kernel:
        try:
            return self.kernels[name]
        except KeyError:
            raise KdaError(f"kernel {name} is not in this build ({self.path})") from None

    def ensure_loaded(self, names, device_id: int) -> None:
        for name in names:
            self.kernel(name).ensure_loaded(device_id)

    def current_device(self, what: str = "querying the current device") -> int:
        """The calling thread's current CUDA device (the static runtime's view, which is the
        driver context the caller's framework made current)."""
        device = ctypes.c_int32(0)
        self._check(self._lib.kda_get_device(ctypes.byref(device)), what)
        return device.value

    def has(self, name: str) -> bool:
        return name in self.kernels

    def missing_variants(self) -> List[str]:
        """This package's kernel variants the library does not hold: the measurement-only ones for a
        library of the shipped lattice, none for one of every variant (KDA_KERNEL_LATTICE=all)."""
        from .constants import variant_constants

        return [name for name in variant_constants() if name not in self.kernels]

    def device_count(self) -> int:
        """Visible CUDA devices; raises CudaError when there is no usable driver."""
        count = ctypes.c_int32(0)
        code = self._lib.kda_device_count(ctypes.byref(count))
        if code == CUDA_ERROR_INSUFFICIENT_DRIVER:
            # CUDA's static runtime returns this one code both without a driver and with one older
            # than the build's CUDA; either way the fix is the driver, so the message says so.
            raise CudaError("querying CUDA devices", code, self._lib.kda_error_name(code).decode(),
                            self._lib.kda_error_string(code).decode()
                            + " (CUDA's code for a missing driver and for an old one alike): install or upgrade"
                              " the NVIDIA driver, R575 or newer for a cu12 build, R580 or newer for cu13")
        self._check(code, "querying CUDA devices")
        return count.value


_library: Optional[KernelLibrary] = None
_library_lock = threading.Lock()


def library_dir() -> Path:
    """KDA_AOT_LIB_DIR when set, else the packaged _lib. The variable must be an absolute path:
    a relative one would resolve against whatever the working directory is at first use, so
    the same process could load different libraries from different directories."""
    value = os.environ.get(LIB_DIR_ENV)
    if not value:
        return LIB_DIR
    path = Path(value)
    if not path.is_absolute():
        raise LibraryNotFoundError(f"{LIB_DIR_ENV}: must be an absolute path, got {value!r} "
                                   f"(for example {LIB_DIR_ENV}={Path(value).resolve()})")
    return path


def get_library() -> KernelLibrary:
    """The process-wide library, loaded on first use (thread-safe)."""
    global _library
    if _library is None:
        with _library_lock:
            if _library is None:
                _library = KernelLibrary(library_dir())
    return _library


def kernel_names() -> Sequence[str]:
    return list(get_library().kernels)
