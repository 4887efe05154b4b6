#!/usr/bin/env bash
# Build the prebuilt manylinux wheel of one CUDA flavour from a clean tree (docs/wheels.md).
#
#   bash ci/build_wheels.sh <cu12|cu13> [--rev REV] [--out DIR] [--fresh-cache] [--keep]
#
#   cu12: distribution kda-aot-cu12, DSL default flavour, static CUDA runtime 12.9.79 (driver R575+)
#   cu13: distribution kda-aot-cu13, nvidia-cutlass-dsl[cu13], static CUDA runtime 13.0.96 (R580+)
#
# REV (default HEAD) of this repository is cloned into a temporary folder, so uncommitted changes
# are NOT built. Tools (build, wheel, auditwheel, ziglang) go into a fresh venv; the wheel is built
# by `python -m build` with pip's build isolation (build-system.requires, plus the cu13 override in
# pyproject.toml). The C shim and the final link go through `zig cc -target
# x86_64-linux-gnu.2.28`, so the library only uses glibc <= 2.28 symbols and the wheel is tagged
# py3-none-manylinux_2_28_x86_64, which `auditwheel show` must confirm. Compiled kernels are cached
# in $KDA_BUILD_CACHE (default ~/.cache/kda-aot-build, one folder per flavour; outputs are
# byte-identical, so a hit is as good as a rebuild); --fresh-cache compiles everything anew.
# The wheel lands in DIR (default dist/ of this repository); --keep keeps the temporary folder.
#
# KDA_KERNEL_LATTICE (default shipped) picks the kernels (docs/build.md, "Kernel lattice"): the
# shipped lattice, what the planner launches, or `all`, the measurement wheel, which adds the
# measurement-only kernels that KDA_K2_KERNEL=k2 and the ablations launch (the full device suite:
# KDA_KERNEL_LATTICE=all bash ci/build_wheels.sh cu12).
set -euo pipefail

usage() { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $# -ge 1 ]] || usage
FLAVOUR=$1; shift
case "$FLAVOUR" in cu12|cu13) ;; *) usage ;; esac
REPO=$(cd "$(dirname "$0")/.." && pwd)
REV=HEAD OUT="$REPO/dist" FRESH_CACHE=0 KEEP=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rev) REV=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --fresh-cache) FRESH_CACHE=1; shift ;;
    --keep) KEEP=1; shift ;;
    *) usage ;;
  esac
done

# Pinned tools: the toolchain decides which glibc symbols the library needs.
ZIGLANG_VERSION=0.17.0
TOOL_PINS=("build==1.6.1" "wheel==0.48.0" "auditwheel==6.8.2" "ziglang==$ZIGLANG_VERSION")
GLIBC_TARGET=2.28
PLAT=manylinux_2_28_x86_64
DIST="kda-aot-$FLAVOUR"
LATTICE=${KDA_KERNEL_LATTICE:-shipped}
case "$LATTICE" in shipped|all) ;; *) echo "KDA_KERNEL_LATTICE must be shipped or all, not '$LATTICE'" >&2; exit 2 ;; esac
PYTHON=${PYTHON:-python3}

# This machine's pip configuration names local index folders that may be absent: drop that noise.
pip_quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }
T0=$SECONDS
step() { printf '\n[build_wheels %s +%ss] %s\n' "$FLAVOUR" "$((SECONDS - T0))" "$*"; }
die() { printf '[build_wheels %s] ERROR: %s\n' "$FLAVOUR" "$*" >&2; exit 1; }

OUT=$(realpath -m "$OUT")
for tool in git objdump readelf; do command -v "$tool" >/dev/null || die "$tool is needed (git; binutils)"; done
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "building needs Python >= 3.11 (build_kernels reads pyproject.toml with tomllib); set PYTHON="

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kda-wheel-$FLAVOUR-XXXXXX")
cleanup() { if [[ $KEEP == 1 ]]; then echo "[build_wheels $FLAVOUR] kept $WORK"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT

# 1. A clean tree of REV.
SHA=$(git -C "$REPO" rev-parse --verify "$REV^{commit}") || die "no commit $REV in $REPO"
step "source: $REPO at $REV = ${SHA:0:12}"
if [[ -n $(git -C "$REPO" status --porcelain --untracked-files=no) && $REV == HEAD ]]; then
  echo "  note: $REPO has uncommitted changes; they are not in this wheel (it builds ${SHA:0:12})"
fi
git clone -q --shared --no-checkout "$REPO" "$WORK/src"
git -C "$WORK/src" -c advice.detachedHead=false checkout -q --detach "$SHA"
# The distribution is named per flavour; the import package stays kda_aot and the version stays
# the one in pyproject.toml. Hide the rename from git so the manifest's revision is not "-dirty".
sed -i -E "s/^name = \"kda-aot\"$/name = \"$DIST\"/" "$WORK/src/pyproject.toml"
grep -q "^name = \"$DIST\"$" "$WORK/src/pyproject.toml" || die "could not rename the distribution in pyproject.toml"
# The runtime pins follow the flavour too (docs/wheels.md, "Runtime dependencies"): pyproject.toml
# carries cu12's on the two lines marked "flavour pin"; cu13 gets CUDA 13's bindings.
case "$FLAVOUR" in
  cu12) PIN_BINDINGS="cuda-bindings>=12.8,<13" PIN_CORE="cuda-core>=0.5,<1.3" ;;
  cu13) PIN_BINDINGS="cuda-bindings>=13,<14" PIN_CORE="cuda-core>=0.5" ;;
esac
sed -i -E \
  -e "s/^  \"cuda-bindings[^\"]*\",  # flavour pin$/  \"$PIN_BINDINGS\",  # flavour pin/" \
  -e "s/^  \"cuda-core[^\"]*\",  # flavour pin$/  \"$PIN_CORE\",  # flavour pin/" \
  "$WORK/src/pyproject.toml"
for pin in "$PIN_BINDINGS" "$PIN_CORE"; do
  grep -qF "  \"$pin\",  # flavour pin" "$WORK/src/pyproject.toml" || die "could not pin $pin in pyproject.toml"
done
echo "  runtime pins: $PIN_BINDINGS, $PIN_CORE"
git -C "$WORK/src" update-index --assume-unchanged pyproject.toml
VERSION=$(sed -nE 's/^version = "(.*)"$/\1/p' "$WORK/src/pyproject.toml" | head -1)
echo "  distribution $DIST $VERSION"

# 2. Tools in a fresh venv, and zig as the C compiler and linker.
step "tools venv: ${TOOL_PINS[*]}"
"$PYTHON" -m venv "$WORK/tools"
TPY="$WORK/tools/bin/python"
pip_quiet "$TPY" -m pip install -q --disable-pip-version-check "${TOOL_PINS[@]}"
ZIG=$("$TPY" -c "import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), 'zig'))")
mkdir -p "$WORK/zig"
printf '#!/bin/sh\nexec "%s" cc -target x86_64-linux-gnu.%s "$@"\n' "$ZIG" "$GLIBC_TARGET" >"$WORK/zig/cc"
chmod +x "$WORK/zig/cc"
echo "  zig $("$ZIG" version): $WORK/zig/cc = zig cc -target x86_64-linux-gnu.$GLIBC_TARGET"

# 3. The wheel.
CACHE=${KDA_BUILD_CACHE:-$HOME/.cache/kda-aot-build}
[[ $FRESH_CACHE == 1 ]] && CACHE="$WORK/kernel-cache"
step "building $DIST (KDA_CUDA_FLAVOUR=$FLAVOUR, KDA_KERNEL_LATTICE=$LATTICE, kernel cache $CACHE)"
TB=$SECONDS
KDA_CUDA_FLAVOUR=$FLAVOUR KDA_KERNEL_LATTICE=$LATTICE KDA_BUILD_CACHE=$CACHE "$TPY" -m build --wheel --outdir "$WORK/dist" \
  -C "cmake.define.CMAKE_C_COMPILER=$WORK/zig/cc" \
  -C "wheel.tags=py3-none-$PLAT" \
  -C "build-dir=$WORK/build" \
  "$WORK/src"
BUILD_S=$((SECONDS - TB))
shopt -s nullglob
WHEELS=("$WORK"/dist/*.whl)
[[ ${#WHEELS[@]} == 1 ]] || die "expected one wheel in $WORK/dist, found ${#WHEELS[@]}"
WHEEL=${WHEELS[0]}
NAME=$(basename "$WHEEL")
[[ $NAME == "${DIST//-/_}-$VERSION-py3-none-$PLAT.whl" ]] || die "unexpected wheel name $NAME"

# 4. What the wheel holds and needs.
step "checking $NAME"
"$TPY" - "$WHEEL" "$FLAVOUR" "$VERSION" "$SHA" "$LATTICE" >"$WORK/manifest.txt" <<'EOF'
import json, sys, zipfile
wheel, flavour, version, sha, lattice = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    m = json.loads(z.read("kda_aot/_lib/manifest.json"))
    names = z.namelist()
assert "kda_aot/_lib/libkda_kernels.so" in names, "library missing from the wheel"
assert "kda_aot/py.typed" in names, "py.typed missing from the wheel"
missing = [f"kda_aot/{sub}/__init__.py" for sub in ("intake", "library", "plan", "references", "spec")
           if f"kda_aot/{sub}/__init__.py" not in names]
assert not missing, f"sub-packages missing from the wheel: {missing}"
assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names), \
    "LICENSE missing from the wheel's dist-info"
assert m["cuda_flavour"] == flavour, f"manifest flavour {m['cuda_flavour']} != {flavour}"
assert m["package_version"] == version, f"manifest version {m['package_version']} != {version}"
assert m["kernels"], "manifest lists no kernels"
assert m.get("lattice") == lattice, f"manifest lattice {m.get('lattice')} != {lattice}"
assert sha.startswith(m["git_revision"]), f"manifest revision {m['git_revision']} is not {sha[:12]}"
print(len(m["kernels"]), m["cudart_version"], m["dsl_version"], m["git_revision"])
EOF
read -r N_KERNELS CUDART DSL_VERSION GIT_REV <"$WORK/manifest.txt"
mkdir -p "$WORK/unpacked"
(cd "$WORK/unpacked" && "$TPY" -m zipfile -e "$WHEEL" .)
SO="$WORK/unpacked/kda_aot/_lib/libkda_kernels.so"
NEWEST_GLIBC=$(objdump -T "$SO" | grep -oE 'GLIBC_[0-9]+\.[0-9]+(\.[0-9]+)?' | sed 's/GLIBC_//' | sort -V | tail -1)
echo "  newest glibc symbol version: GLIBC_$NEWEST_GLIBC (target $GLIBC_TARGET)"
[[ $(printf '%s\n%s\n' "$NEWEST_GLIBC" "$GLIBC_TARGET" | sort -V | tail -1) == "$GLIBC_TARGET" ]] \
  || die "the library needs GLIBC_$NEWEST_GLIBC, newer than $GLIBC_TARGET"
NEEDED=$(readelf -d "$SO" | sed -nE 's/.*\(NEEDED\).*\[(.*)\]/\1/p' | tr '\n' ' ')
echo "  NEEDED: $NEEDED"
for lib in $NEEDED; do
  [[ $lib =~ ^(libc|libm|libdl|librt|libpthread|ld-linux-x86-64)\.so ]] || die "library needs $lib (not libc-family)"
done
"$WORK/tools/bin/auditwheel" show "$WHEEL" | tee "$WORK/auditwheel.txt"
# auditwheel names the most compatible tag the wheel satisfies; any manylinux_2_X with X <= 28
# means the manylinux_2_28 tag holds (a wheel good for glibc 2.X runs on every glibc >= 2.X).
AUDIT_TAG=$(tr -s ' \n' '  ' <"$WORK/auditwheel.txt" \
  | sed -nE 's/.*is consistent with the following platform tag: "(manylinux_2_([0-9]+)_x86_64)".*/\1 \2/p')
read -r AUDIT_PLAT AUDIT_MINOR <<<"${AUDIT_TAG:-none 999}"
[[ $AUDIT_MINOR -le ${GLIBC_TARGET#2.} ]] || die "auditwheel finds the wheel consistent with $AUDIT_PLAT, not $PLAT"
echo "  auditwheel: consistent with $AUDIT_PLAT, so the $PLAT tag holds"

mkdir -p "$OUT"
rm -f "$OUT/${DIST//-/_}-$VERSION-"*.whl
cp "$WHEEL" "$OUT/"
SIZE=$(stat -c %s "$WHEEL")
step "done"
cat <<EOF
== build_wheels summary ==
wheel:     $OUT/$NAME
size:      $SIZE bytes ($(awk "BEGIN{printf \"%.2f\", $SIZE/1048576}") MiB)
flavour:   $FLAVOUR (cudart $CUDART static, DSL $DSL_VERSION)
kernels:   $N_KERNELS (manifest; lattice $LATTICE)
revision:  $GIT_REV
platform:  $PLAT (newest glibc symbol GLIBC_$NEWEST_GLIBC; auditwheel show: consistent with $AUDIT_PLAT)
time:      $((SECONDS - T0)) s in all, $BUILD_S s in python -m build
EOF
