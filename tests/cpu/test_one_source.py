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
    from kda_aot.spec.call_options import PLANNED

    names = prefill_args.NAMES
    assert arguments.TENSOR_ARGS == names + ("workspace",) and program.INPUTS == names + ("workspace", "stream")
    assert set(validation._REQUIRED + validation._OPTIONAL) == set(names)
    assert set(validation._INPUTS) | set(validation._OUTPUTS) == set(names)
    assert validation._DTYPES == {a.name: tuple(a.align) for a in prefill_args.ARGS}
    assert validation.ALIGNMENT is prefill_args.ALIGNMENT
    for fn, target in ((api.prefill, api._prefill), (api.workspace_size, api._workspace_size)):
        # the body is compiled from the tables' names (intake/by_name.py): the target receives
        # every tensor in TENSOR_ARGS order and every plan-shaping option in PLANNED order
        params = inspect.signature(fn).parameters
        assert all(name in params for name in arguments.TENSOR_ARGS), fn.__name__
        sentinels = {name: object() for name in params}
        seen = []
        assert fn.__code__.co_filename.startswith("<kda_aot: kda_aot.api."), fn.__code__.co_filename
        with _calls_recorded(fn, target, seen):
            fn(*(sentinels[n] for n in ("q", "k", "v", "g", "beta")),
               **{n: v for n, v in sentinels.items() if n not in ("q", "k", "v", "g", "beta")})
        (tensors, planned, *rest), = seen
        assert tensors == tuple(sentinels[n] for n in arguments.TENSOR_ARGS), fn.__name__
        assert planned == tuple(sentinels[n] for n in PLANNED), fn.__name__
        # no hand-written tuple of the tensors in either function's source
        tree = ast.parse(textwrap.dedent(inspect.getsource(target)))
        assert not [node for node in ast.walk(tree) if isinstance(node, ast.Tuple) and len(node.elts) > 12], fn.__name__


def _calls_recorded(fn, target, seen):
    """fn's compiled body with its target replaced by a recorder: the body's namespace (its
    __globals__, made by intake/by_name.py) holds the target as `_call`."""
    import contextlib

    @contextlib.contextmanager
    def swap():
        namespace = fn.__globals__
        assert namespace["_call"] is target
        namespace["_call"] = lambda *args: seen.append(args)
        try:
            yield
        finally:
            namespace["_call"] = target

    return swap()


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
    # built from the planned options in PLANNED order, as prefill's body passes them
    values = {o.name: o.default for o in call_options.OPTIONS if o.plans}
    values.update(scale=0.5, gate="softplus")
    got = call_options.CallOptions.of(tuple(values[n] for n in call_options.PLANNED), ("lens", (16,)))
    assert got == call_options.CallOptions(scale=0.5, gate="softplus", hint=("lens", (16,)))
