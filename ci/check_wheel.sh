#!/usr/bin/env bash
# Check a built wheel the way a user gets it (docs/wheels.md).
#
#   bash ci/check_wheel.sh dist/kda_aot_cu12-*.whl [--no-tests] [pytest args...]
#
# Installs the wheel into a fresh venv WITHOUT nvidia-cutlass-dsl (a build-time dependency only),
# imports it from outside the source tree, checks kda_aot.info() (manifest present, its CUDA
# flavour the one in the wheel's name, kernels present and matching the manifest, the version),
# checks that without a driver the library says so clearly (CUDA error 35, insufficient driver),
# then runs this repository's tests against the installed wheel with torch==2.13.0 (the CPU build
# that lies on disk on our machines; never an unpinned torch, which would pull a CUDA build).
set -euo pipefail

[[ $# -ge 1 ]] || { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
WHEEL=$(realpath "$1"); shift
RUN_TESTS=1
if [[ ${1:-} == --no-tests ]]; then RUN_TESTS=0; shift; fi
REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
TORCH_PIN="torch==2.13.0"

NAME=$(basename "$WHEEL")
[[ -f $WHEEL ]] || { echo "check_wheel: no such wheel: $WHEEL" >&2; exit 2; }
if [[ $NAME =~ ^kda_aot_(cu1[23])-([^-]+)-py3-none-([^.]+)\.whl$ ]]; then
  FLAVOUR=${BASH_REMATCH[1]} VERSION=${BASH_REMATCH[2]} PLAT=${BASH_REMATCH[3]}
else
  echo "check_wheel: $NAME is not a kda_aot_cu12/cu13 wheel (see ci/build_wheels.sh)" >&2; exit 2
fi
DIST="kda-aot-$FLAVOUR"

# This machine's pip configuration names local index folders that may be absent: drop that noise.
pip_quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }
T0=$SECONDS
step() { printf '\n[check_wheel %s +%ss] %s\n' "$FLAVOUR" "$((SECONDS - T0))" "$*"; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kda-check-$FLAVOUR-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
unset KDA_AOT_LIB_DIR PYTHONPATH  # the installed package and its own library, nothing else

step "fresh venv; installing $NAME[test] and $TORCH_PIN"
"$PYTHON" -m venv "$WORK/venv"
PY="$WORK/venv/bin/python"
pip_quiet "$PY" -m pip install -q --disable-pip-version-check "$WHEEL[test]" "$TORCH_PIN"
"$PY" -m pip list --disable-pip-version-check 2>/dev/null \
  | grep -iE "^(kda-aot|torch|numpy|ml.dtypes|cuda-bindings|cuda-core|nvidia-)" | sed 's/^/  /'
if "$PY" -m pip show -q nvidia-cutlass-dsl >/dev/null 2>&1; then
  echo "check_wheel: nvidia-cutlass-dsl got installed: it must stay a build-time dependency" >&2; exit 1
fi

step "import and kda_aot.info()"
cd /tmp  # never the source tree
"$PY" - "$FLAVOUR" "$VERSION" "$DIST" "$REPO" <<'EOF'
import importlib.util, json, re, sys
from importlib import metadata
from pathlib import Path

flavour, version, dist, repo = sys.argv[1:]
assert importlib.util.find_spec("cutlass") is None, "the DSL is importable: this check needs an env without it"
import kda_aot

pkg = Path(kda_aot.__file__).resolve().parent
assert not pkg.is_relative_to(Path(repo).resolve()), f"kda_aot imported from the source tree: {pkg}"
info = kda_aot.info(full=True)
assert info.get("library"), f"no library: {info.get('error')}"
assert Path(info["library"]).resolve().parent == pkg / "_lib", f"library not from the wheel: {info['library']}"
m = info["manifest"]
assert m["cuda_flavour"] == flavour, f"manifest flavour {m['cuda_flavour']}, wheel name says {flavour}"
assert m["package_version"] == version, f"manifest version {m['package_version']}, wheel name says {version}"
assert metadata.version(dist) == version, f"{dist} metadata says {metadata.version(dist)}"
assert kda_aot.__version__ == version, f"kda_aot.__version__ is {kda_aot.__version__}, expected {version}"
# The runtime pins must be the flavour's (docs/wheels.md, "Runtime dependencies"): a cu12 wheel that
# resolved cuda-bindings 13.x would need an R580 driver. Compared as specifier sets, written out
# here independently of ci/build_wheels.sh, which sets them.
expected = {
    "cu12": {"cuda-bindings": {">=12.8", "<13"}, "cuda-core": {">=0.5", "<1.3"}},
    "cu13": {"cuda-bindings": {">=13", "<14"}, "cuda-core": {">=0.5"}},
}[flavour]
found = {}
for req in metadata.requires(dist) or []:
    if "extra ==" in req:
        continue
    name, spec = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*\(?([^;)]*)", req).groups()
    name = re.sub(r"[-_.]+", "-", name).lower()
    found[name] = {s.replace(" ", "") for s in spec.split(",") if s.strip()}
for name, specs in expected.items():
    assert found.get(name) == specs, f"{dist} requires {name} {sorted(found.get(name, ()))}, expected {sorted(specs)}"
print("  Requires-Dist: " + ", ".join(f"{n}{','.join(sorted(found[n]))}" for n in sorted(found)))
assert info["version"] == version
names = [k["name"] for k in m["kernels"]]
assert names and sorted(names) == info["kernels"], "library kernels differ from the manifest"
assert {"cudart_version", "dsl_version", "git_revision", "arch"} <= set(m)
print(f"  version {info['version']}, flavour {m['cuda_flavour']} (cudart {m['cudart_version']}), "
      f"DSL {m['dsl_version']}, {m['arch']}, revision {m['git_revision']}, {len(names)} kernels")
print(f"  library {info['library']}")
if info["devices"]:
    print(f"  {info['devices']} CUDA device(s) visible: the no-driver error is not checked here")
else:
    err = info.get("device_error", "")
    print(f"  devices: 0; device_error: {err}")
    code = re.search(r"CUDA error (\d+) \((\w+)\)", err)
    assert code and int(code.group(1)) in (35, 100, 3, 999), f"unclear device error: {err!r}"
    if not Path("/dev/nvidiactl").exists():
        assert int(code.group(1)) == 35, f"no driver here, expected CUDA error 35, got {err!r}"
EOF

if [[ $RUN_TESTS == 1 ]]; then
  step "tests from $REPO/tests against the installed wheel"
  "$PY" -m pytest -c "$REPO/pyproject.toml" --rootdir "$REPO" "$REPO/tests" -p no:cacheprovider "$@"
fi
step "done: $NAME ($PLAT) checked in $((SECONDS - T0)) s"
