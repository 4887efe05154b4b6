#!/usr/bin/env bash
# The whole test suite on a GPU machine, against a built wheel (not the source tree).
#   bash ci/gpu_tests.sh [path/to/kda_aot-*.whl] [extra pytest args...]
# The full suite needs the measurement wheel (every kernel variant: KDA_KERNEL_LATTICE=all bash
# ci/build_wheels.sh cu12); with the shipped one, the tests forcing KDA_K2_KERNEL=k2 skip.
# KDA_TEST_PATHS narrows the run (e.g. "$REPO/tests/gpu": the GPU tests alone, when the CPU suite
# has passed on the build machine); default: every test.
# Logs go to $OUT (default /tmp/kda-gpu-out) so a hang still leaves a trace; every test has a
# timeout (a synchronisation bug hangs rather than fails) and the whole run is bounded too.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
shift || true
python3 -c "import json, kda_aot; i = kda_aot.info(); i.pop('manifest', None); print(json.dumps(i))" | tee "$OUT/info.json"
timeout --signal=KILL "${KDA_SUITE_TIMEOUT:-1500}" python3 -m pytest -c "$REPO/pyproject.toml" --rootdir "$REPO" \
  ${KDA_TEST_PATHS:-"$REPO/tests"} -p no:cacheprovider --timeout "${KDA_TEST_TIMEOUT:-300}" --junitxml "$OUT/junit.xml" "$@" \
  2>&1 | tee "$OUT/pytest.log"
exit "${PIPESTATUS[0]}"
