"""CPU tests of the stream-handle check, with a fake device query."""

import pytest

from kda_aot.intake.stream_check import DEFAULT_STREAMS, check_stream_handle


class FakeDriver:
    """Streams 0x1000 (cuda:0) and 0x2000 (cuda:1) exist; anything else is an invalid handle."""

    streams = {0x1000: 0, 0x2000: 1, 2 ** 64 - 1: 0}

    def __init__(self):
        self.asked = []

    def __call__(self, handle):
        self.asked.append(handle)
        try:
            return self.streams[handle]
        except KeyError:
            raise RuntimeError("cuStreamGetDevice failed: CUDA_ERROR_INVALID_HANDLE") from None


@pytest.mark.parametrize("handle,device", [(0x1000, 0), (0x2000, 1), (2 ** 64 - 1, 0)])
def test_stream_of_the_device_is_accepted(handle, device):
    query = FakeDriver()
    check_stream_handle(handle, device, query)
    assert query.asked == [handle]


@pytest.mark.parametrize("handle", DEFAULT_STREAMS)
@pytest.mark.parametrize("device", [0, 3])
def test_default_streams_are_valid_without_a_query(handle, device):
    query = FakeDriver()
    check_stream_handle(handle, device, query)
    assert query.asked == []


@pytest.mark.parametrize("handle,match", [
    (-1, "handle -1 is not a CUDA stream"),
    (2 ** 64, "handle 18446744073709551616 is not a CUDA stream"),
    (0x3000, r"handle 0x3000 is not a valid CUDA stream \(cuStreamGetDevice failed: CUDA_ERROR_INVALID_HANDLE\)"),
])
def test_invalid_handles(handle, match):
    with pytest.raises(ValueError, match=f"^stream: {match}"):
        check_stream_handle(handle, 0, FakeDriver())


def test_stream_of_another_device():
    with pytest.raises(ValueError, match=r"^stream: handle 0x2000 belongs to cuda:1, but q is on cuda:0"):
        check_stream_handle(0x2000, 0, FakeDriver())


@pytest.mark.parametrize("handle", [True, 1.0, "0x1000", None])
def test_non_int_handles(handle):
    with pytest.raises(TypeError, match="^stream: expected an integer stream handle"):
        check_stream_handle(handle, 0, FakeDriver())


def test_a_query_returning_garbage_is_an_invalid_stream():
    with pytest.raises(ValueError, match="^stream: handle 0x1000 is not a valid CUDA stream"):
        check_stream_handle(0x1000, 0, lambda h: "cuda:0")


def test_numpy_integer_handle():
    np = pytest.importorskip("numpy")
    check_stream_handle(np.uint64(0x1000), 0, FakeDriver())


def test_real_query_without_a_driver_is_an_invalid_stream():
    """Here (no NVIDIA driver) the real query fails cleanly: the check reports it, no crash."""
    pytest.importorskip("cuda.bindings")
    from kda_aot.intake.stream_check import stream_device

    try:
        stream_device(0x1000)
    except Exception as exc:
        with pytest.raises(ValueError, match="^stream: handle 0x1000 is not a valid CUDA stream"):
            check_stream_handle(0x1000, 0, stream_device)
    else:  # pragma: no cover - a machine with a driver
        pytest.skip("a CUDA driver is present")
