"""Save the PTX of kernel variants, or compare it with a saved set: refactors without a GPU.

    python -m build_kernels.ptx_check --save DIR [--only NAME ...]     # e.g. at a GPU-tested commit
    python -m build_kernels.ptx_check --compare DIR [--only NAME ...]  # after the refactor
    python -m build_kernels.ptx_check --compare DIR --ignore-entry-names  # a kernel moved or renamed

A change to kernel source that leaves every variant's PTX identical (comment lines aside) cannot
change what runs, so it needs no new GPU run; any difference is listed and the exit status is 1.
--ignore-entry-names compares the PTX with each kernel's entry symbol replaced by its position: the
DSL spells the symbol from the kernel function's name and its compile-time arguments (a method's
from its object), and nothing outside the exported object refers to it (the host code the DSL
generates looks the kernel up by the name it gave it), so a kernel moved into a class, or passed
its constants another way, is the same kernel if only that symbol differs.
This is how the shared K2 / pre_scan helpers of tile step Q2, Q3 and Q5 were checked.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

from . import compile as kc
from .registry import all_variants


def variant_ptx(variant) -> str:
    """The variant's PTX without comment lines (they carry paths and tool versions)."""
    with tempfile.TemporaryDirectory() as tmp:
        kc.compile_entry(variant, f" --keep-ptx --dump-dir {tmp}")
        files = sorted(Path(tmp).rglob("*.ptx"))
        if not files:
            raise kc.KernelCompileError(f"kernel {variant.name}: no PTX was dumped")
        text = "\n".join(f.read_text() for f in files)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//")) + "\n"


def without_entry_names(ptx: str) -> str:
    """The PTX with every kernel entry symbol (and the parameter names spelled from it) replaced by
    `__entry<i>`, i its position among the PTX's entries."""
    names = re.findall(r"^\.visible \.entry (\w+)\(", ptx, flags=re.M)
    for i, name in sorted(enumerate(names), key=lambda item: -len(item[1])):
        ptx = ptx.replace(name, f"__entry{i}")
    return ptx


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m build_kernels.ptx_check", description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--save", type=Path, help="write <DIR>/<variant>.ptx for every variant")
    mode.add_argument("--compare", type=Path, help="compare every variant with <DIR>/<variant>.ptx")
    parser.add_argument("--only", nargs="*", help="these variants only")
    parser.add_argument("--ignore-entry-names", action="store_true",
                        help="compare with the kernels' entry symbols replaced by their position")
    args = parser.parse_args(argv)
    variants = [v for v in all_variants() if not args.only or v.name in set(args.only)]
    differ = []
    for variant in variants:
        ptx = variant_ptx(variant)
        if args.save:
            args.save.mkdir(parents=True, exist_ok=True)
            (args.save / f"{variant.name}.ptx").write_text(ptx)
            continue
        saved = args.compare / f"{variant.name}.ptx"
        if saved.exists() and args.ignore_entry_names:
            same = without_entry_names(saved.read_text()) == without_entry_names(ptx)
        else:
            same = saved.exists() and saved.read_text() == ptx
        if not same:
            differ.append(variant.name)
        print(f"[ptx_check] {variant.name:<40} {'identical' if same else 'DIFFERS' if saved.exists() else 'not saved'}",
              flush=True)
    if args.save:
        print(f"[ptx_check] saved {len(variants)} variants to {args.save}")
        return 0
    print(f"[ptx_check] {len(variants) - len(differ)} of {len(variants)} identical" +
          (" (entry symbols aside)" if args.ignore_entry_names else "") +
          (f"; differ: {', '.join(differ)}" if differ else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
