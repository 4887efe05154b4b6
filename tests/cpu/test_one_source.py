"""Facts stated once: each of these numbers and lists has one definition, and every other place
derives it (no GPU needed). A restatement that drifts would make the two wings disagree silently."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tracked(suffixes):
    try:
        names = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, check=True,
                               text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no git checkout here")
    return [ROOT / n for n in names if n.endswith(suffixes)]


def test_log2e_is_written_once():
    hits = [p.relative_to(ROOT).as_posix() for p in _tracked((".py", ".c", ".h", ".cu"))
            if "1.4426950408889634" in p.read_text(errors="replace") and not p.name.startswith("test_")]
    # declared by the build, rendered into the runtime's generated _abi.py (abi --check keeps it fresh)
    assert sorted(hits) == ["build_kernels/shared_constants.py", "kda_aot/library/_abi.py"], hits


def test_restated_constants_are_the_abi_constants():
    from kda_aot.library import constants
    from kda_aot.intake import arguments
    from kda_aot.plan import dist_plan, launcher, program
    from kda_aot.references import reference_np

    assert dist_plan.CHUNK is constants.CHUNK and program.MAX_SLOTS is constants.MAX_SLOTS
    assert launcher.LOG2E is constants.LOG2E and reference_np.LOG2E is constants.LOG2E
    # the per-call pointer vector is prefill's tensor arguments, then the stream
    assert program.INPUTS == arguments.TENSOR_ARGS + ("stream",)


def test_where_the_register_state_k2_runs_is_the_builds_statement():
    """REGSTATE_VALUE_BLOCKS is declared by the build (the value blocks the twin is compiled at) and
    the planner picks the twin at exactly those: no module of the runtime restates the tuple."""
    from kda_aot.library import constants
    from kda_aot.plan import planner

    assert planner.REGSTATE_VALUE_BLOCKS is constants.REGSTATE_VALUE_BLOCKS
    assert sorted(vb for vb in constants.VALUE_BLOCKS if planner.k2_kernel(vb) == "regstate") == \
        sorted(constants.REGSTATE_VALUE_BLOCKS)
    hits = [p.relative_to(ROOT).as_posix() for p in _tracked((".py",))
            if "REGSTATE_VALUE_BLOCKS = " in p.read_text(errors="replace") and not p.name.startswith("test_")]
    assert sorted(hits) == ["build_kernels/shared_constants.py", "kda_aot/library/_abi.py"], hits


def test_the_torch_reference_reads_the_same_log2e():
    pytest.importorskip("torch")
    from kda_aot.library import constants
    from kda_aot import reference

    assert reference.LOG2E is constants.LOG2E


def test_the_shims_slot_limit_comes_from_the_abi_constants():
    # Read as text: importing build_kernels' entry would import the DSL, which a wheel's venv lacks.
    shim = (ROOT / "build_kernels" / "shim" / "kda_shim.c").read_text()
    assert "#define KDA_MAX_SLOTS" not in shim and "KDA_MAX_SLOTS" in shim
    build = (ROOT / "build_kernels" / "__main__.py").read_text()
    assert 'f"#define KDA_MAX_SLOTS {ABI_CONSTANTS.MAX_SLOTS}"' in build


def test_prefill_tensor_arguments_are_declared_once():
    """prefill_args.ARGS is the one declaration: the wall's tables, the pointer vector, the intake
    order and the `tensors` tuples prefill and workspace_size build all follow it."""
    import ast
    import inspect
    import textwrap

    from kda_aot import api
    from kda_aot.intake import arguments
    from kda_aot.spec import prefill_args
    from kda_aot.plan import program
    from kda_aot.intake import validation

    names = prefill_args.NAMES
    assert arguments.TENSOR_ARGS == names + ("workspace",) and program.INPUTS == names + ("workspace", "stream")
    assert set(validation._REQUIRED + validation._OPTIONAL) == set(names)
    assert set(validation._INPUTS) | set(validation._OUTPUTS) == set(names)
    assert validation._DTYPES == {a.name: tuple(a.align) for a in prefill_args.ARGS}
    assert validation.ALIGNMENT is prefill_args.ALIGNMENT
    for fn in (api.prefill, api.workspace_size):
        # the tensors (and options) are read by name from the function's locals() taken first
        # thing, while they are its parameters alone: no hand-written tuple to keep in order
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        body = tree.body[0].body
        first, second = body[1:3] if isinstance(body[0], ast.Expr) else body[0:2]  # after the docstring
        assert ast.unparse(first) == "given = locals()", fn.__name__
        assert ast.unparse(second).startswith("tensors = arguments.gather_tensors(given)"), fn.__name__
        assert "CallOptions.gather(given" in ast.unparse(tree), fn.__name__
        assert not [node for node in ast.walk(tree) if isinstance(node, ast.Tuple) and len(node.elts) > 12], fn.__name__
        params = inspect.signature(fn).parameters
        assert all(name in params for name in arguments.TENSOR_ARGS), fn.__name__


def test_options_declared_once():
    """prefill's option keywords and defaults, CallOptions' fields and the torch operators' option
    types all come from spec/call_options.OPTIONS."""
    import inspect

    from kda_aot import api
    from kda_aot.spec import call_options

    params = inspect.signature(api.prefill).parameters
    for option in call_options.OPTIONS:
        assert params[option.name].default == option.default, option.name
        assert params[option.name].kind is inspect.Parameter.KEYWORD_ONLY, option.name
    assert call_options.CallOptions._fields == call_options.PLANNED + ("hint",)
    assert call_options.CallOptions() == tuple(o.default for o in call_options.OPTIONS if o.plans) + (None,)
    # 1, 1.0 and True are equal in a tuple, but the plan key tells them apart
    a, b = call_options.CallOptions(scale=1), call_options.CallOptions(scale=1.0)
    assert a == b and a.key() != b.key()
    # gathered by name from a call's locals(), as prefill does
    values = {o.name: o.default for o in call_options.OPTIONS}
    values.update(scale=0.5, gate="softplus", q=object())
    got = call_options.CallOptions.gather(values, ("lens", (16,)))
    assert got == call_options.CallOptions(scale=0.5, gate="softplus", hint=("lens", (16,)))
