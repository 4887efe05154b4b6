"""DLPack intake: the torch fast path describes tensors exactly as the DLPack path does."""

import pytest

from kda_aot.intake.tensors import TensorDesc, describe, describe_dlpack

try:
    import torch
except ImportError:  # the DLPack-only tests below run without it
    torch = None
# The torch fast path's own tests (kda_aot/intake/tensors.py _describe_torch) need torch.
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (tests of the torch fast path)")


@needs_torch
@pytest.mark.parametrize("make", [
    lambda: torch.randn(2, 3, 4, 128).to(torch.bfloat16),
    lambda: torch.randn(5, 6)[:, 1:4],
    lambda: torch.arange(7, dtype=torch.int64)[2:],
    lambda: torch.zeros(0, 4, dtype=torch.int32),
    lambda: torch.randn(4, 4).t(),
])
def test_torch_fast_path_matches_dlpack(make):
    t = make()
    fast, slow = describe(t, "x"), describe_dlpack(t, "x")
    assert fast == slow
    assert (fast.ptr, fast.shape, fast.strides, fast.dtype, fast.device) == (
        slow.ptr, slow.shape, slow.strides, slow.dtype, slow.device)


@needs_torch
def test_descriptions_are_hashable_and_ignore_the_owner():
    a = describe(torch.zeros(3), "x")
    b = TensorDesc(**{**a.__dict__, "owner": None})
    assert a == b and hash(a) == hash(b)


def test_non_tensor_is_refused_by_name():
    with pytest.raises(TypeError, match="^q: expected a DLPack tensor"):
        describe([1, 2], "q")


# --------------------------------------------------------------------------------------------
# Producers that speak DLPack but are not torch tensors (the general intake path)

class Producer:
    """The smallest DLPack producer: forwards to a wrapped array (numpy, torch), so intake takes
    the general StridedMemoryView path whatever the wrapped array is."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_read_only_producer_is_described_read_only():
    np = pytest.importorskip("numpy")
    a = np.zeros((2, 3), dtype=np.float32)
    assert describe(Producer(a), "out").readonly is False
    a.flags.writeable = False  # numpy exports it with DLPACK_FLAG_BITMASK_READ_ONLY
    d = describe(Producer(a), "out")
    assert d.readonly is True and d.dtype == "float32" and d.shape == (2, 3)


@needs_torch
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64",
                                   "complex64", "complex128"])
@pytest.mark.parametrize("path", ["torch", "dlpack"])
def test_unknown_dtype_is_refused_by_name(dtype, path):
    t = torch.zeros(3, dtype=getattr(torch, dtype))
    obj = t if path == "torch" else Producer(t)
    with pytest.raises(TypeError, match=f"^k: .*dtype.*not supported"):
        describe(obj, "k")


def test_numpy_unknown_dtype_is_refused_by_name():
    np = pytest.importorskip("numpy")
    with pytest.raises(TypeError, match="^beta: dtype uint16 is not supported"):
        describe(Producer(np.zeros(3, dtype=np.uint16)), "beta")


def test_itemsize_is_total():
    from kda_aot.intake import dtypes

    sizes = {"bfloat16": 2, "float32": 4, "int64": 8, "bool": 1, "float8_e4m3fn": 1, "uint16": 2,
             "uint32": 4, "complex64": 8, "complex128": 16, "float4_e2m1fn": 1, "": 1, "?": 1}
    for name, size in sizes.items():
        assert dtypes.itemsize(name) == size, name
        d = TensorDesc(name="x", ptr=0, shape=(3,), strides=(1,), dtype=name, device="cuda", device_id=0)
        assert d.nbytes == 3 * size
    assert dtypes.itemsize(None) == 1 and dtypes.itemsize(object()) == 1  # not a dtype name


@needs_torch
@pytest.mark.parametrize("make,match", [
    (lambda: torch._neg_view(torch.randn(4)), r"^q: a torch negative view.*\.resolve_neg\(\)"),
    (lambda: torch.randn(4, dtype=torch.complex64).conj(), r"^q: a torch conjugate view.*\.resolve_conj\(\)"),
])
def test_lazy_neg_and_conj_views_are_refused(make, match):
    t = make()
    with pytest.raises(ValueError, match=match):
        describe(t, "q")


@needs_torch
def test_resolved_views_are_described():
    t = torch._neg_view(torch.randn(4)).resolve_neg()
    assert describe(t, "q").dtype == "float32"
