# Sourced by ci/test.sh and ci/demo.sh (not run on its own): the checkout's own virtual
# environment, so the README's two commands never install into the interpreter that runs them.
#
#   source ci/venv.sh; venv_setup NAME; venv_install_package NAME ".[test]" ...
#
# After venv_setup, $PY is the venv's python. REPO must be set by the caller.

VENV="${KDA_VENV:-$REPO/.venv}"  # KDA_VENV: another folder (.ci/run keeps a torch-free one)
# pip's log of the last package install (full -v output); the terminal only shows the progress.
INSTALL_LOG="$VENV/last-install.log"

# This machine's pip configuration names local index folders that may be absent: drop that noise.
_pip_noise() { grep -v "is ignored: it is neither a file nor a directory" || true; }

say() { printf '[%s] %s\n' "$VENV_WHO" "$*"; }

venv_setup() {
  VENV_WHO=$1
  local base=${PYTHON:-python3}
  # Reuse the venv only if its interpreter still starts: a venv whose base Python was removed or
  # upgraded keeps a dangling bin/python, and recreating it is cheaper than debugging that.
  if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c "import sys" 2>/dev/null; then
    say "reusing the virtual environment $VENV"
  else
    say "creating the virtual environment $VENV ($("$base" --version 2>&1) from $(command -v "$base"))"
    rm -rf "$VENV"
    "$base" -m venv "$VENV"
  fi
  PY="$VENV/bin/python"
  # pip inside the venv only; a failed upgrade (offline machine) leaves the bundled pip, which works.
  "$PY" -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | _pip_noise >/dev/null || true
}

# torch is never a runtime dependency (plain `import kda_aot` never imports it), and the CPU tests
# and the demo's CPU path do not need it either (NumPy references): the tests that do (the torch
# op, the torch reference, every GPU test) skip without it, saying so. venv_want_torch says whether
# to install it: when KDA_WITH_TORCH=1 (CI runs the torch tests that way) or when an NVIDIA GPU is
# visible (the GPU tests and the demo's GPU checks need it). An importable torch in the venv (say a
# CUDA build the user put there) is always kept and used.
venv_want_torch() {
  [[ ${KDA_WITH_TORCH:-0} == 1 ]] && return 0
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'
}

# The pinned CPU-compatible release: on the CI machine it lies on disk (/opt/wheels), and an
# unpinned `pip install torch` would download several GB of CUDA build on a fresh clone.
TORCH_PIN="torch==2.13.0"
venv_ensure_torch() {
  if ! venv_want_torch; then
    if "$PY" -c "import torch" 2>/dev/null; then
      say "torch $("$PY" -c 'import torch; print(torch.__version__)') is in the venv: the torch tests run too"
    else
      say "no torch in the venv and none needed here (no GPU): the tests that need torch skip, saying so;" \
          "KDA_WITH_TORCH=1 installs $TORCH_PIN to run them"
    fi
    return 0
  fi
  if "$PY" -c "import torch" 2>/dev/null; then
    say "torch $("$PY" -c 'import torch; print(torch.__version__)') is already in the venv"
  else
    say "installing $TORCH_PIN into the venv (test and demo dependency)"
    "$PY" -m pip install -q --disable-pip-version-check "$TORCH_PIN" 2>&1 | _pip_noise
  fi
}

# pip install of this source tree (plus any extra requirements), which compiles the kernels.
# pip hides a build's output unless -v; -v shows everything, so its output goes to INSTALL_LOG and
# the terminal gets build_kernels' one line per kernel (it prints them with flush=True as each
# kernel finishes) and the CMake status lines. On failure the log's tail is shown.
venv_install_package() {
  say "installing $* into the venv: compiling the kernels (about a second each, cached in" \
      "${KDA_BUILD_CACHE:-$HOME/.cache/kda-aot-build}); full log in $INSTALL_LOG"
  local t0=$SECONDS
  if ! "$PY" -m pip install -v --disable-pip-version-check "$@" 2>&1 | tee "$INSTALL_LOG" \
       | { grep --line-buffered -E '\[build_kernels\]|-- kda-aot:|^Successfully installed' || true; }; then
    say "pip install failed; the end of $INSTALL_LOG:"
    tail -n 40 "$INSTALL_LOG" | _pip_noise
    return 1
  fi
  say "installed in $((SECONDS - t0)) s"
}
