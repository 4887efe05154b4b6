# Sourced by the device scripts: installs a built wheel (and any peer wheels carried in .whl/)
# into a temporary site, puts it first on PYTHONPATH and leaves the shell in /tmp, so nothing
# imports the source tree's kda_aot. Sets REPO, OUT, SITE.
# The full device suite wants the measurement wheel, with every kernel variant (docs/testing.md):
#   KDA_KERNEL_LATTICE=all bash ci/build_wheels.sh cu12
# A wheel of the shipped lattice runs too; what needs a measurement-only kernel then skips, naming it.
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-/tmp/kda-gpu-out}
mkdir -p "$OUT"
WHEEL=${1:-$(ls "$REPO"/dist/kda_aot*.whl 2>/dev/null | head -n 1)}
[ -f "$WHEEL" ] || { echo "no wheel given or found in dist/ (build one with: pip wheel . -w dist)"; exit 2; }
SITE=$(mktemp -d)
python3 -m pip install -q --no-deps --no-index --target "$SITE" "$WHEEL" || exit 2
# Optional peers carried as wheels in .whl/ (e.g. flash-linear-attention and fla-core, pure Python):
# the tests and the benchmark compare against them when importable.
if compgen -G "$REPO/.whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-deps --no-index --target "$SITE" "$REPO"/.whl/*.whl || exit 2
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
python3 - "$SITE/kda_aot/_lib/manifest.json" <<'PY' | tee "$OUT/lattice.txt"
import json, sys
m = json.load(open(sys.argv[1]))
lattice = m.get("lattice", "?")
print(f"kernel lattice: {lattice} ({len(m['kernels'])} kernels)"
      + ("" if lattice == "all" else "; the tests and sanitizer cases of the measurement-only kernels skip: "
         "for the full suite build the measurement wheel, KDA_KERNEL_LATTICE=all bash ci/build_wheels.sh cu12"))
PY
cd /tmp
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
