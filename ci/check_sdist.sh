#!/usr/bin/env bash
# Build the source distribution and check it the way a user without a wheel gets it.
#
#   bash ci/check_sdist.sh [--rev REV] [--out DIR] [--no-tests] [pytest args...]
#
# 1. clones REV (default HEAD; uncommitted changes are not in it) into a temporary folder and runs
#    `python -m build --sdist` there (pinned `build` in a fresh venv);
# 2. lists the sdist (`tar tzf`) and checks it holds what a build needs and nothing else:
#    PKG-INFO, pyproject.toml, README.md, LICENSE, and every tracked file of build_kernels/ and
#    kda_aot/ (pyproject.toml's [tool.scikit-build] sdist.include / sdist.exclude decide this);
# 3. `pip install <sdist>[test]` into a fresh venv (python3 -m venv), which compiles the kernels
#    (the cu12 flavour, cached in ~/.cache/kda-aot-build like every build), plus torch==2.13.0
#    (the CPU build that lies on disk here; never an unpinned torch);
# 4. runs tests/ of this repository against that install from outside the source tree (GPU tests
#    skip without a Hopper GPU; tests/build/test_ptx.py skips without the DSL, which a build from
#    the sdist only installs into pip's isolated build environment).
# The sdist is copied to DIR (default dist/ of this repository).
set -euo pipefail

usage() { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
REV=HEAD OUT="$REPO/dist" RUN_TESTS=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rev) REV=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-tests) RUN_TESTS=0; shift ;;
    -h|--help) usage ;;
    *) break ;;  # the rest goes to pytest
  esac
done
PYTHON=${PYTHON:-python3}
BUILD_PIN="build==1.6.1"
TORCH_PIN="torch==2.13.0"

pip_quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }
T0=$SECONDS
step() { printf '\n[check_sdist +%ss] %s\n' "$((SECONDS - T0))" "$*"; }
die() { printf '[check_sdist] ERROR: %s\n' "$*" >&2; exit 1; }

OUT=$(realpath -m "$OUT")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kda-sdist-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
unset KDA_AOT_LIB_DIR PYTHONPATH KDA_CUDA_FLAVOUR  # the default (cu12) build, its own library

# 1. The sdist of a clean tree.
SHA=$(git -C "$REPO" rev-parse --verify "$REV^{commit}") || die "no commit $REV in $REPO"
step "source: $REPO at $REV = ${SHA:0:12}"
git clone -q --shared --no-checkout "$REPO" "$WORK/src"
git -C "$WORK/src" -c advice.detachedHead=false checkout -q --detach "$SHA"
VERSION=$(sed -nE 's/^version = "(.*)"$/\1/p' "$WORK/src/pyproject.toml" | head -1)
"$PYTHON" -m venv "$WORK/tools"
pip_quiet "$WORK/tools/bin/python" -m pip install -q --disable-pip-version-check "$BUILD_PIN"
step "python -m build --sdist (kda-aot $VERSION)"
"$WORK/tools/bin/python" -m build --sdist --outdir "$WORK/dist" "$WORK/src" | tail -n 2
SDIST="$WORK/dist/kda_aot-$VERSION.tar.gz"
[[ -f $SDIST ]] || die "expected $SDIST; found: $(ls "$WORK/dist")"

# 2. Its contents: what a build needs, nothing else.
step "contents of $(basename "$SDIST")"
tar tzf "$SDIST" | sed "s|^kda_aot-$VERSION/||" | grep -v '/$' | sort >"$WORK/contents.txt"
sed 's/^/  /' "$WORK/contents.txt"
{ printf '%s\n' PKG-INFO pyproject.toml README.md LICENSE
  git -C "$WORK/src" ls-files -- build_kernels kda_aot
  echo kda_aot/py.typed
} | sort -u >"$WORK/expected.txt"
if ! diff -u "$WORK/expected.txt" "$WORK/contents.txt" >"$WORK/contents.diff"; then
  sed 's/^/  /' "$WORK/contents.diff" >&2
  die "the sdist differs from what a build needs ('-': missing, '+': not needed); see sdist.include/exclude in pyproject.toml"
fi
echo "  $(wc -l <"$WORK/contents.txt") files, $(stat -c %s "$SDIST") bytes: exactly what a build needs"
mkdir -p "$OUT"
rm -f "$OUT"/kda_aot-*.tar.gz
cp "$SDIST" "$OUT/"

# 3. Install it into a fresh venv (the build compiles the kernels).
step "fresh venv; pip install $(basename "$SDIST")[test] $TORCH_PIN"
"$PYTHON" -m venv "$WORK/venv"
PY="$WORK/venv/bin/python"
TB=$SECONDS
pip_quiet "$PY" -m pip install -q --disable-pip-version-check "$SDIST[test]" "$TORCH_PIN"
echo "  installed in $((SECONDS - TB)) s"
"$PY" -m pip list --disable-pip-version-check 2>/dev/null \
  | grep -iE "^(kda-aot|torch|cuda-bindings|cuda-core) " | sed 's/^/  /'
cd /tmp  # never the source tree
"$PY" - "$VERSION" "$REPO" <<'EOF'
import sys
from importlib import metadata
from pathlib import Path

version, repo = sys.argv[1:]
import kda_aot

pkg = Path(kda_aot.__file__).resolve().parent
assert not pkg.is_relative_to(Path(repo).resolve()), f"kda_aot imported from the source tree: {pkg}"
assert metadata.version("kda-aot") == version == kda_aot.__version__
assert (pkg / "py.typed").is_file(), "py.typed not installed"
info = kda_aot.info(full=True)
assert info.get("library"), f"no library: {info.get('error')}"
m = info["manifest"]
assert m["cuda_flavour"] == "cu12" and m["package_version"] == version and m["kernels"]
print(f"  kda_aot {version} from the sdist: flavour {m['cuda_flavour']}, {len(m['kernels'])} kernels, "
      f"revision {m['git_revision']}, library {info['library']}")
EOF

# 4. The CPU tests against that install.
if [[ $RUN_TESTS == 1 ]]; then
  step "tests from $REPO/tests against the sdist's install"
  "$PY" -m pytest -c "$REPO/pyproject.toml" --rootdir "$REPO" "$REPO/tests" -p no:cacheprovider "$@"
fi
step "done: $(basename "$SDIST") built, listed, installed and tested in $((SECONDS - T0)) s"
