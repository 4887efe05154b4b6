"""kda-aot's FLA backend without a GPU (kda_aot/fla_backend.py).

- fla absent: `import kda_aot.torch` works and registers nothing; plain `import kda_aot` imports
  neither torch, fla nor the backend module.
- fla present: a minimal stand-in `fla` package (written into the test's tmp dir, first on
  sys.path, in a subprocess) offers FLA's registry interface: `fla.backends.BaseBackend`,
  `register(entry_point)` and a dispatched `fla.ops.kda.chunk.chunk_kda`, with a FlashKDA-like
  backend at FlashKDA's priority. The test checks registration, the order against FlashKDA, the
  FLA_KDA_AOT switch and a call dispatched through to kda_aot.api.prefill.
- the verifier, in-process: it accepts exactly the calls kda_aot.torch.chunk_kda computes, over
  the grid of FLA's flags, and declines the rest with a reason.
tests/gpu/test_fla_backend.py runs the real fla's layers and models through the backend.
"""

import itertools
import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from torch_stand_ins import Recording  # noqa: E402

from kda_aot import api  # noqa: E402
from kda_aot import reference
from kda_aot import fla_backend  # noqa: E402

D = 128


def _run(code: str, *, path=None, env=None) -> dict:
    """`code` in a fresh interpreter; it prints one JSON line, returned here."""
    full_env = dict(os.environ, **(env or {}))
    if path is not None:
        full_env["PYTHONPATH"] = os.pathsep.join([str(path)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full_env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# fla absent

def test_without_fla_nothing_is_registered_and_nothing_fails():
    # sys.modules[name] = None is Python's mark for "not importable": find_spec answers None and an
    # import raises ImportError, whether or not fla is installed on this machine
    got = _run("""
        import json, sys
        sys.modules["fla"] = None
        import kda_aot
        plain = sorted(m for m in ("torch", "fla", "kda_aot.fla_backend", "kda_aot.torch")
                       if sys.modules.get(m) is not None)
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            import kda_aot.torch
        from kda_aot import fla_backend
        print(json.dumps(dict(plain=plain, backend=fla_backend.BACKEND is None,
                              again=fla_backend.register_if_installed())))
    """)
    assert got == dict(plain=[], backend=True, again=False)


# ---------------------------------------------------------------------------------------------
# a minimal fla package with FLA's registry interface

FAKE_BACKENDS = '''
"""The interface of fla/backends.py that backends use: BaseBackend, register, dispatch."""
import os


class BaseBackend:
    backend_type = "base"
    package_name = None
    env_var = None
    default_enable = True
    priority = 5
    implementation = None
    verifier = None

    @classmethod
    def is_available(cls):
        return True

    def is_enabled(self):
        # FLA's rule: FLA_<TYPE> != "0" forces it on, else env_var (default by default_enable)
        if self.env_var is None:
            return True
        if os.environ.get("FLA_" + self.backend_type.upper(), "0") != "0":
            return True
        return os.environ.get(self.env_var, "1" if self.default_enable else "0") != "0"

    def verify(self, name, *args, **kwargs):
        check = self.verifier or getattr(self, name + "_verifier", None)
        return (True, None) if check is None else check(*args, **kwargs)


REGISTRY = {}  # function name -> [backend instances]
LOG = []  # (backend_type or "default", reason of each decline)


def dispatch(fn):
    backends = REGISTRY.setdefault(fn.__name__, [])

    def wrapper(*args, **kwargs):
        for backend in sorted(backends, key=lambda b: b.priority):
            if not (backend.is_available() and backend.is_enabled()):
                continue
            ok, why = backend.verify(fn.__name__, *args, **kwargs)
            if not ok:
                LOG.append((backend.backend_type, why))
                continue
            LOG.append((backend.backend_type, None))
            return getattr(backend, fn.__name__)(*args, **kwargs)
        LOG.append(("default", None))
        return fn(*args, **kwargs)

    wrapper.__wrapped__ = fn
    wrapper.__name__ = fn.__name__
    return wrapper


def register(entry_point):
    def decorator(cls):
        backend = cls()
        backend.verifier = None
        REGISTRY[entry_point.__wrapped__.__name__].append(backend)
        return cls
    return decorator
'''

FAKE_CHUNK = '''
from fla.backends import BaseBackend, dispatch, register


@dispatch
def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **kwargs):
    return "fla's own kernels", None


@register(chunk_kda)
class FlashKDALike(BaseBackend):
    """FlashKDA's registration in fla-core 0.6.0: its type, switch and priority; it accepts all."""
    backend_type = "flash_kda"
    env_var = "FLA_FLASH_KDA"
    priority = 3

    def chunk_kda_verifier(self, *args, **kwargs):
        return True, None

    def chunk_kda(self, *args, **kwargs):
        return "flash_kda", None
'''


@pytest.fixture
def fake_fla(tmp_path):
    files = {"fla/__init__.py": "", "fla/backends.py": FAKE_BACKENDS, "fla/ops/__init__.py": "",
             "fla/ops/kda/__init__.py": "from fla.ops.kda.chunk import chunk_kda\n", "fla/ops/kda/chunk.py": FAKE_CHUNK}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


DISPATCH = """
    import json, os, sys, torch
    import kda_aot.torch
    from kda_aot import api, fla_backend
    import fla.backends
    from fla.ops.kda import chunk_kda

    calls = []
    api.prefill = lambda q, *a, **kw: calls.append(kw["gate"]) or (torch.zeros_like(q), None)
    fla_backend.device_refusal = lambda t: None  # CPU tensors stand for sm_90 ones here
    H, T = 2, 8
    bf = dict(dtype=torch.bfloat16)
    q, k, v, g = (torch.randn(1, T, H, 128, **bf) for _ in range(4))
    beta = torch.randn(1, T, H, **bf)
    A_log, dt_bias = torch.rand(H), torch.rand(H * 128)
    flags = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                 A_log=A_log, dt_bias=dt_bias)
    with torch.inference_mode():
        softplus = chunk_kda(q, k, v, g, beta, **flags)[0]
        gva = chunk_kda(q, k, torch.cat([v, v], 2), g, beta, **flags)[0]
    with_grad = chunk_kda(q, k, v, g, beta, **flags)[0]
    backends = sorted((b.backend_type, b.priority, b.env_var, type(b).__mro__[1] is fla.backends.BaseBackend)
                      for b in fla.backends.REGISTRY["chunk_kda"])
    print(json.dumps(dict(calls=calls, softplus=isinstance(softplus, torch.Tensor), gva=gva, with_grad=with_grad,
                          backends=backends, log=fla.backends.LOG)))
"""


def test_registers_ahead_of_flashkda_and_dispatches_to_kda_aot(fake_fla):
    got = _run(DISPATCH, path=fake_fla)
    assert got["backends"] == [["flash_kda", 3, "FLA_FLASH_KDA", True], ["kda_aot", 2, "FLA_KDA_AOT", True]]
    assert fla_backend.PRIORITY < fla_backend.FLASH_KDA_PRIORITY == 3
    assert got["softplus"] and got["calls"] == ["softplus"], "the softplus-gate call did not reach kda_aot.api.prefill"
    # GVA and autograd are declined, with a reason, and the next backend answers
    assert got["gva"] == "flash_kda" and got["with_grad"] == "flash_kda"
    declines = [why for who, why in got["log"] if who == "kda_aot" and why]
    assert len(declines) == 2 and "GVA" in declines[0] and "no backward" in declines[1], declines


@pytest.mark.parametrize("env,answer", [({"FLA_KDA_AOT": "0"}, "flash_kda"),
                                        ({"FLA_KDA_AOT": "0", "FLA_FLASH_KDA": "0"}, "fla's own kernels"),
                                        ({"FLA_KDA_AOT": "1", "FLA_FLASH_KDA": "0"}, "kda-aot")])
def test_fla_kda_aot_switch(fake_fla, env, answer):
    got = _run("""
        import json, torch
        import kda_aot.torch
        from kda_aot import api, fla_backend
        from fla.ops.kda import chunk_kda

        api.prefill = lambda q, *a, **kw: ("kda-aot", None)
        fla_backend.device_refusal = lambda t: None
        bf = dict(dtype=torch.bfloat16)
        q = torch.randn(1, 8, 2, 128, **bf)
        with torch.no_grad():
            o, _ = chunk_kda(q, q, q, q, q[..., 0], use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                             lower_bound=-5.0, safe_gate=True, A_log=torch.rand(2), dt_bias=torch.rand(256))
        print(json.dumps(dict(answer=o)))
    """, path=fake_fla, env=env)
    assert got["answer"] == answer


def test_a_broken_fla_warns_and_does_not_break_the_import(tmp_path):
    (tmp_path / "fla").mkdir()
    (tmp_path / "fla" / "__init__.py").write_text("raise RuntimeError('broken on purpose')\n")
    got = _run("""
        import json, warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import kda_aot.torch
        from kda_aot import fla_backend
        print(json.dumps(dict(backend=fla_backend.BACKEND is None, warned=[str(w.message) for w in caught
                                                                           if "fla" in str(w.message)])))
    """, path=tmp_path)
    assert got["backend"] and len(got["warned"]) == 1 and "broken on purpose" in got["warned"][0]


# ---------------------------------------------------------------------------------------------
# the verifier accepts exactly what chunk_kda computes

@pytest.fixture
def on_sm90(monkeypatch):
    """CPU tensors stand for tensors on an sm_90 device (the device check has its own test)."""
    monkeypatch.setattr(fla_backend, "device_refusal", lambda t: None)


def _tensors(H=2, T=8, g_dtype=torch.bfloat16, beta_dtype=torch.bfloat16):
    x = reference.make_inputs((1, T), H, seed=3, state="fp32")
    x["g"], x["beta"] = x["g"].to(g_dtype), x["beta"].to(beta_dtype)
    return x


GRID = dict(use_qk_l2norm_in_kernel=(True, False), use_gate_in_kernel=(True, False),
            use_beta_sigmoid_in_kernel=(True, False), allow_neg_eigval=(False, True), safe_gate=(False, True),
            lower_bound=(None, -5.0, -3.0, -8.0, 0.0), A_log=(True, False), dt_bias=(True, False),
            g_dtype=(torch.bfloat16, torch.float32), beta_dtype=(torch.bfloat16, torch.float32))


def test_verifier_accepts_exactly_what_chunk_kda_computes(on_sm90, monkeypatch):
    """Over every combination of FLA's flags, lower bounds, gate parameters and g / beta dtypes:
    the verifier accepts a call iff kda_aot.torch.chunk_kda runs it (without a GPU: the kernels'
    stand-in records the call). A decline always says why."""
    import kda_aot.torch as kt

    monkeypatch.setattr(api, "prefill", Recording())
    inputs = {(gd, bd): _tensors(g_dtype=gd, beta_dtype=bd) for gd in GRID["g_dtype"] for bd in GRID["beta_dtype"]}
    accepted = total = 0
    names = list(GRID)
    for values in itertools.product(*GRID.values()):
        c = dict(zip(names, values))
        x = inputs[c.pop("g_dtype"), c.pop("beta_dtype")]
        if c.pop("A_log"):
            c["A_log"] = x["A_log"]
        if c.pop("dt_bias"):
            c["dt_bias"] = x["dt_bias"]
        args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
        with torch.inference_mode():
            ok, why = fla_backend.verify(*args, initial_state=x["initial_state"], output_final_state=True, **c)
            try:
                kt.chunk_kda(*args, initial_state=x["initial_state"], output_final_state=True, **c)
                ran = True
            except (NotImplementedError, ValueError):
                ran = False
        assert ok == ran, (c, why)
        assert ok or why, c
        accepted += ok
        total += 1
    assert 0 < accepted < total  # both answers occur


DECLINED = [
    (dict(grad=True), "no backward"),
    (dict(use_qk_l2norm_in_kernel=False), "use_qk_l2norm_in_kernel=False"),
    (dict(gva=True), "GVA"),
    (dict(head_dim=64), "head dim 64"),
    (dict(q_dtype=torch.float16), "q: dtype torch.float16"),
    (dict(g_dtype=torch.float32), "g: dtype torch.float32"),
    (dict(cp_context=object()), "cp_context"),
    (dict(return_intermediate_states=True), "return_intermediate_states"),
    (dict(head_first=False), "head_first: not an option"),
    (dict(chunk_size=16), "chunk_size"),
    (dict(A_log_shape=(1, 1, 2, 1)), "A_log: kda-aot takes [H]"),
    (dict(dt_bias_dtype=torch.float64), "dt_bias: kda-aot takes"),
    (dict(max_num_seqs=5), "max_num_seqs"),
    (dict(state_dtype=torch.float16), "initial_state: dtype torch.float16"),
]


@pytest.mark.parametrize("change,reason", DECLINED, ids=[r.split(":")[0].split("=")[0] for _, r in DECLINED])
def test_verifier_declines_with_a_reason(on_sm90, change, reason):
    change = dict(change)
    x = _tensors(g_dtype=change.pop("g_dtype", torch.bfloat16))
    args = dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"])
    kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True,
              lower_bound=-5.0, A_log=x["A_log"], dt_bias=x["dt_bias"].reshape(-1), initial_state=x["initial_state"])
    if change.pop("gva", False):
        args["v"] = torch.cat([args["v"], args["v"]], dim=2)
    if change.pop("head_dim", None):
        args["q"] = args["k"] = args["q"][..., :64]
    if "q_dtype" in change:
        args["q"] = args["q"].to(change.pop("q_dtype"))
    if "A_log_shape" in change:
        kw["A_log"] = kw["A_log"].reshape(change.pop("A_log_shape"))
    if "dt_bias_dtype" in change:
        kw["dt_bias"] = kw["dt_bias"].to(change.pop("dt_bias_dtype"))
    if "state_dtype" in change:
        kw["initial_state"] = kw["initial_state"].to(change.pop("state_dtype"))
    if "max_num_seqs" in change:
        kw["cu_seqlens"] = torch.tensor([0, 8], dtype=torch.int64)
        args = {name: t.reshape(1, -1, *t.shape[2:]) for name, t in args.items()}
    grad = change.pop("grad", False)
    kw.update(change)
    with torch.set_grad_enabled(grad):
        ok, why = fla_backend.verify(*args.values(), **kw)
    assert not ok and reason in why, why
    x = _tensors()
    with torch.no_grad():  # the same call without the change is accepted
        assert fla_backend.verify(x["q"], x["k"], x["v"], x["g"], x["beta"], use_qk_l2norm_in_kernel=True,
                                  use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True,
                                  lower_bound=-5.0, A_log=x["A_log"], dt_bias=x["dt_bias"]) == (True, None)


def test_verifier_declines_cpu_tensors_and_other_architectures(monkeypatch):
    x = _tensors()
    with torch.no_grad():
        ok, why = fla_backend.verify(x["q"], x["k"], x["v"], x["g"], x["beta"], use_qk_l2norm_in_kernel=True,
                                     use_gate_in_kernel=True, A_log=x["A_log"])
    assert not ok and why == "kda-aot runs on CUDA tensors, got q on cpu"
    # a device's answer is asked once and kept: the capability does not change within a process
    monkeypatch.setattr(fla_backend, "_DEVICES", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (10, 0))
    assert fla_backend._probe(3) == "kda-aot's kernels are built for sm_90a; cuda:3 is sm_100"
    asked = []
    monkeypatch.setattr(fla_backend, "_probe", lambda index: asked.append(index) or "no")

    class OnDevice:
        is_cuda, device = True, "cuda:1"

        def get_device(self):
            return 1

    assert fla_backend.device_refusal(OnDevice()) == "no" and fla_backend.device_refusal(OnDevice()) == "no"
    assert asked == [1]
