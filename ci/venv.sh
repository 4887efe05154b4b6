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
    # Several GB on a fresh machine: each download is shown with its size.
    "$PY" -m pip install --disable-pip-version-check "$TORCH_PIN" 2>&1 \
      | { grep -E --line-buffered '^ *Downloading |^Successfully installed' || true; }
  fi
}

# JAX's CPU wheel, for the CPU tests of kda_aot.jax (tests/cpu/test_jax.py: the trace-time checks and
# refusals; the jitted calls need a GPU). Pinned to the release that lies on the CI machine's disk
# (/opt/pypi/files: jax and jaxlib, about 90 MB, installed in some 20 s, nothing downloaded); an
# unpinned install would fetch whatever is newest. KDA_WITH_JAX=0 leaves it out (the tests then
# skip, saying so); a JAX already in the venv (a CUDA build, say) is kept.
JAX_PIN="jax==0.10.2"
venv_ensure_jax() {
  if [[ ${KDA_WITH_JAX:-1} == 0 ]]; then
    say "KDA_WITH_JAX=0: no JAX installed; the JAX tests skip, saying so"
  elif "$PY" -c "import jax" 2>/dev/null; then
    say "JAX $("$PY" -c 'import jax; print(jax.__version__)') is already in the venv"
  else
    say "installing $JAX_PIN (its CPU wheel) into the venv (test dependency)"
    "$PY" -m pip install -q --disable-pip-version-check "$JAX_PIN" 2>&1 | _pip_noise || \
      say "could not install $JAX_PIN: the JAX tests skip, saying so"
  fi
}

# What an install of this tree depends on, as one hash: the content of every file git tracks or
# would track (untracked files that .gitignore does not exclude), the build's environment
# variables and the venv's Python. Empty outside a git checkout (an unpacked sdist), where every
# call installs.
_tree_fingerprint() {
  git -C "$REPO" rev-parse --is-inside-work-tree >/dev/null 2>&1 || return 0
  {
    printf 'flavour=%s cache=%s\n' "${KDA_CUDA_FLAVOUR:-}" "${KDA_BUILD_CACHE:-}"
    "$PY" -c 'import sys; print(sys.version)'
    # A tracked file deleted in the work tree is listed but unreadable: its absence is part of
    # the tree's state, so it is hashed as missing rather than failing the pipeline.
    git -C "$REPO" ls-files -z -co --exclude-standard | while IFS= read -r -d '' f; do
      if [[ -f "$REPO/$f" ]]; then printf '%s ' "$f"; sha1sum < "$REPO/$f"; else printf '%s missing\n' "$f"; fi
    done
  } | sha1sum | cut -d' ' -f1
}

# Records which installs this venv holds for which tree: line 1 the tree's fingerprint, then one
# line per argument list installed from that tree. ci/demo.sh and ci/test.sh install different
# lists (".", ".[test] ..."), so a run of one does not undo the other's.
INSTALL_STATE="$VENV/kda-install.state"

# The progress of `pip install -v` (read on stdin): pip's steps (build requirements, the wheel
# build, the final install), each download of a megabyte or more with its size (the CuTe DSL is
# about 100 MB), CMake's kda-aot status lines and build_kernels' lines (one summary line for a
# build served from the cache; otherwise a counter line per kernel compiled, with the time left),
# each after the seconds since the install started. A first install takes minutes on a small
# machine: it must not look stuck.
_install_progress() {
  local t0=$1 line
  while IFS= read -r line; do
    case $line in
      *'[build_kernels]'* | *'-- kda-aot:'* | 'Successfully installed '* | *'Downloading '*' MB)' \
        | *'Downloading '*' GB)' \
        | *'Installing build dependencies: started'* | *'Installing backend dependencies: started'* \
        | *'Building wheel for '*': started'* | 'Installing collected packages: '*) ;;
      *) continue ;;
    esac
    line=${line#"${line%%[![:space:]]*}"}  # leading blanks off
    case $line in
      'Installing build dependencies'*) line="pip: installing the build requirements (scikit-build-core)" ;;
      'Installing backend dependencies'*) line="pip: installing the build's own requirements (the CuTe DSL, CUDA's static runtime)" ;;
      'Building wheel for '*) line="pip: building the wheel: CMake compiles the kernels, then links the library" ;;
      'Installing collected packages: '*) line="pip: installing the wheel and its requirements" ;;
    esac
    printf '  %4d s  %s\n' $((SECONDS - t0)) "${line:0:200}"
  done
}

# pip install of this source tree (plus any extra requirements), which compiles the kernels.
# Skipped when this venv already holds the same install of the same tree (a warm demo spent 14 s
# in a reinstall that changed nothing); KDA_REINSTALL=1 forces it.
# pip hides a build's output unless -v; -v shows everything, so its output goes to INSTALL_LOG and
# the terminal gets its progress (_install_progress). On failure the log's tail is shown.
venv_install_package() {
  local fingerprint wanted="$*"
  fingerprint=$(_tree_fingerprint)
  if [[ -n $fingerprint && ${KDA_REINSTALL:-0} != 1 && -f $INSTALL_STATE ]] \
     && [[ $(head -n 1 "$INSTALL_STATE") == "$fingerprint" ]] \
     && tail -n +2 "$INSTALL_STATE" | grep -qxF -- "$wanted" \
     && "$PY" -c "import kda_aot" 2>/dev/null; then
    say "the venv already holds $wanted from this tree (unchanged since; KDA_REINSTALL=1 reinstalls)"
    return 0
  fi
  say "installing $* into the venv, which compiles the kernels: several minutes the first time on a" \
      "small machine, seconds once they are cached in ${KDA_BUILD_CACHE:-$HOME/.cache/kda-aot-build};" \
      "full log in $INSTALL_LOG"
  local t0=$SECONDS
  # Set aside, not kept: an interrupted install must not look finished.
  mv -f "$INSTALL_STATE" "$INSTALL_STATE.prev" 2>/dev/null || true
  if ! "$PY" -m pip install -v --disable-pip-version-check "$@" 2>&1 | tee "$INSTALL_LOG" \
       | _install_progress "$t0"; then
    say "pip install failed; the end of $INSTALL_LOG:"
    tail -n 40 "$INSTALL_LOG" | _pip_noise
    return 1
  fi
  if [[ -n $fingerprint ]]; then
    # Written after the install, from the fingerprint taken before it: an edit made while pip
    # ran makes the next call reinstall.
    if [[ -f $INSTALL_STATE.prev && $(head -n 1 "$INSTALL_STATE.prev") == "$fingerprint" ]]; then
      { cat "$INSTALL_STATE.prev"; printf '%s\n' "$wanted"; } > "$INSTALL_STATE"
    else
      printf '%s\n%s\n' "$fingerprint" "$wanted" > "$INSTALL_STATE"
    fi
  fi
  rm -f "$INSTALL_STATE.prev"
  say "installed in $((SECONDS - t0)) s"
}
