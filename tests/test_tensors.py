"""DLPack intake: the torch fast path describes tensors exactly as the DLPack path does."""

import pytest
import torch

from kda_aot.tensors import TensorDesc, describe, describe_dlpack


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


def test_descriptions_are_hashable_and_ignore_the_owner():
    a = describe(torch.zeros(3), "x")
    b = TensorDesc(**{**a.__dict__, "owner": None})
    assert a == b and hash(a) == hash(b)


def test_non_tensor_is_refused_by_name():
    with pytest.raises(TypeError, match="^q: expected a DLPack tensor"):
        describe([1, 2], "q")
