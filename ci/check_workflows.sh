#!/usr/bin/env bash
# Validate .github/workflows/*.yml against GitHub's workflow schema, offline.
#
#   bash ci/check_workflows.sh
#
# check-jsonschema (pinned, in a fresh venv) ships the schema as a vendored file
# (--builtin-schema vendor.github-workflows), so validating needs no network once it is installed.
# Where this machine lets us make a network namespace (unshare -n), the validation runs inside one
# to prove it. A deliberately broken workflow must be rejected, so the check cannot pass vacuously.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
PIN="check-jsonschema==0.39.0"

pip_quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kda-workflows-XXXXXX")
trap 'rm -rf "$WORK"' EXIT

shopt -s nullglob
FILES=("$REPO"/.github/workflows/*.yml "$REPO"/.github/workflows/*.yaml)
[[ ${#FILES[@]} -gt 0 ]] || { echo "check_workflows: no workflow files in $REPO/.github/workflows" >&2; exit 1; }

"$PYTHON" -m venv "$WORK/venv"
pip_quiet "$WORK/venv/bin/python" -m pip install -q --disable-pip-version-check "$PIN"
CJS=("$WORK/venv/bin/check-jsonschema" --builtin-schema vendor.github-workflows)

OFFLINE=()
if unshare -n true 2>/dev/null; then
  OFFLINE=(unshare -n)
  echo "check_workflows: $PIN, validating without network (unshare -n)"
else
  echo "check_workflows: $PIN (no network namespace here; the vendored schema needs none anyway)"
fi

# The schema must reject a workflow whose job has no runs-on and an unknown key.
printf 'on: push\njobs:\n  broken:\n    steps:\n      - run: "true"\n    runs_on: ubuntu-latest\n' >"$WORK/broken.yml"
if "${OFFLINE[@]}" "${CJS[@]}" "$WORK/broken.yml" >"$WORK/broken.log" 2>&1; then
  cat "$WORK/broken.log" >&2
  echo "check_workflows: a broken workflow passed validation: the check is not working" >&2; exit 1
fi

"${OFFLINE[@]}" "${CJS[@]}" "${FILES[@]}"
for f in "${FILES[@]}"; do echo "  ok: ${f#"$REPO"/}"; done
