"""Compile one variant for sm_90a and export it as a C object, with a cache keyed by source hash.

Facts this relies on (docs/build.md §1): no GPU is needed; CUTE_DSL_ARCH must match
--gpu-arch or export_to_c fails; the host code must target generic x86-64; the output is
byte-identical across runs, so a cache hit is as good as a rebuild.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import shutil
from pathlib import Path
from typing import List

from .registry import Arg, Variant

ARCH = "sm_90a"
os.environ["CUTE_DSL_ARCH"] = ARCH  # before the DSL is imported (docs/build.md §1)

import cuda.bindings.driver as cuda  # noqa: E402
import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass.cute.runtime import nullptr  # noqa: E402

HOST_TARGET = "llvm -mtriple=x86_64-unknown-linux-gnu -mcpu=x86-64"
OPTIONS = f"--gpu-arch {ARCH} --opt-level 3 --host-target '{HOST_TARGET}'"
EXPORT_PREFIX = "kdak_"  # kernel symbols; distinct from the shim's public kda_* names
KERNELS_DIR = Path(__file__).parent / "kernels"

_DTYPES = {
    "bfloat16": cutlass.BFloat16, "float16": cutlass.Float16, "float32": cutlass.Float32,
    "int32": cutlass.Int32, "int64": cutlass.Int64, "uint8": cutlass.Uint8,
}
_SCALARS = {"i32": cutlass.Int32, "i64": cutlass.Int64, "f32": cutlass.Float32}


class KernelCompileError(RuntimeError):
    pass


def fake_arg(arg: Arg):
    """The stand-in `cute.compile` traces with: a typed global pointer, a scalar or the stream."""
    if arg.kind == "ptr":
        return nullptr(_DTYPES[arg.dtype], cute.AddressSpace.gmem, assumed_align=arg.align)
    if arg.kind == "stream":
        return cuda.CUstream(0)
    return _SCALARS[arg.kind](0)


def _kernel_sources(module: str, seen: set | None = None) -> List[Path]:
    """The kernel module's file and every module of build_kernels/kernels/ it imports (the helpers of
    common/ among them), transitively; `module` is dotted from kernels/ ("k1_prepare",
    "common.ptx_ops"), and a relative import resolves from the importing module's package."""
    seen = set() if seen is None else seen
    if module in seen:
        return []
    seen.add(module)
    path = KERNELS_DIR.joinpath(*module.split(".")).with_suffix(".py")
    package = module.rpartition(".")[0]
    files = [path]
    for dep in re.findall(r"^from \.(\w+(?:\.\w+)*) import", path.read_text(), flags=re.M):
        files += _kernel_sources(f"{package}.{dep}" if package else dep, seen)
    return files


def fingerprint(variant: Variant) -> str:
    """Hash of everything that determines the object: sources, DSL version, options, variant."""
    h = hashlib.sha256()
    here = Path(__file__)
    for path in sorted(set(_kernel_sources(variant.module))) + [here, here.with_name("registry.py"),
                                                                  here.with_name("shared_constants.py")]:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    h.update(cutlass.__version__.encode() + OPTIONS.encode() + repr(variant.to_json()).encode())
    return h.hexdigest()[:20]


def host_entry(variant: Variant):
    """The object `cute.compile` traces for the variant: the kernel module's attribute named by the
    variant's entry is a kernel class, configured from the constants (`Class(**constants)`), and
    its `@cute.jit __call__` is the host entry."""
    mod = importlib.import_module(f"build_kernels.kernels.{variant.module}")
    return getattr(mod, variant.entry)(**dict(variant.constants))


def compile_entry(variant: Variant, extra_options: str = ""):
    """cute.compile of the variant's host entry with its constants: the one place the build, the
    PTX check and the compile-only tests compile a kernel."""
    return cute.compile(host_entry(variant), *[fake_arg(a) for a in variant.args], options=OPTIONS + extra_options)


def compile_variant(variant: Variant, out_dir: Path, cache_dir: Path) -> bool:
    """Writes out_dir/<name>.o and .h; returns True when it came from the cache."""
    key = fingerprint(variant)
    cached = cache_dir / f"{variant.name}-{key}"
    if not (cached / f"{variant.name}.o").exists():
        try:
            compiled = compile_entry(variant)
            tmp = cached.with_name(cached.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            compiled.export_to_c(str(tmp), variant.name, EXPORT_PREFIX + variant.name)
        except Exception as exc:
            raise KernelCompileError(f"kernel {variant.name} failed to compile: {exc}") from exc
        tmp.rename(cached)
        hit = False
    else:
        hit = True
    for suffix in (".o", ".h"):
        shutil.copyfile(cached / f"{variant.name}{suffix}", out_dir / f"{variant.name}{suffix}")
    return hit


def entry_symbols(variant: Variant, header: Path) -> dict:
    """The three C entry points the exported object defines for this variant."""
    prefix = EXPORT_PREFIX + variant.name
    text = header.read_text()
    call = re.search(rf"void (_mlir_{prefix}__mlir_ciface_\w+)\(void \*\*args", text)
    if call is None:
        raise KernelCompileError(f"kernel {variant.name}: no entry point found in {header.name}")
    return {
        "init": f"_mlir_{prefix}_cuda_init",
        "load_to_device": f"_mlir_{prefix}_cuda_load_to_device",
        "call": call.group(1),
    }
