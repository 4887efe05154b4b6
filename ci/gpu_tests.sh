#!/usr/bin/env bash
# The whole test suite on a GPU machine, against a built wheel (not the source tree).
#   bash ci/gpu_tests.sh [path/to/kda_aot-*.whl] [extra pytest args...]
# Logs go to $OUT (default /tmp/kda-gpu-out) so a hang still leaves a trace; every test has a
# timeout (a synchronisation bug hangs rather than fails) and the whole run is bounded too.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/kda-gpu-out}
mkdir -p "$OUT"
WHEEL=${1:-$(ls "$REPO"/dist/kda_aot*.whl 2>/dev/null | head -n 1)}
shift || true
[ -f "$WHEEL" ] || { echo "no wheel given or found in dist/ (build one with: pip wheel . -w dist)"; exit 2; }
SITE=$(mktemp -d)
python3 -m pip install -q --no-deps --no-index --target "$SITE" "$WHEEL" || exit 2
# Optional peers carried as wheels in .whl/ (e.g. flash-linear-attention and fla-core, pure Python):
# the tests and the benchmark compare against them when importable.
if compgen -G "$REPO/.whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-deps --no-index --target "$SITE" "$REPO"/.whl/*.whl || exit 2
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
cd /tmp  # never import the source tree's kda_aot
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import json, kda_aot; i = kda_aot.info(); i.pop('manifest', None); print(json.dumps(i))" | tee "$OUT/info.json"
timeout --signal=KILL "${KDA_SUITE_TIMEOUT:-1500}" python3 -m pytest -c "$REPO/pyproject.toml" --rootdir "$REPO" \
  "$REPO/tests" -p no:cacheprovider --timeout "${KDA_TEST_TIMEOUT:-300}" --junitxml "$OUT/junit.xml" "$@" \
  2>&1 | tee "$OUT/pytest.log"
exit "${PIPESTATUS[0]}"
