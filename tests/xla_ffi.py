"""XLA's FFI call frame (API 0.1, xla/ffi/api/c_api.h) as ctypes structures, to call the library's
handler (kda_xla_prefill) without XLA: tests/cpu/test_xla_handler.py drives it with hand-built
frames, and ci/jax_host_cost.py serves a custom call from Python through the same layouts.

`frame(...)` builds an execution frame of buffers and attributes; `FakeApi` stands in for XLA's API
table (error creation records the message, the stream getter hands out a fixed handle)."""

import ctypes as C

import numpy as np


class Ext(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("type", C.c_int32), ("next", C.c_void_p)]


class Version(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("major", C.c_int32), ("minor", C.c_int32)]


class Metadata(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("api_version", Version), ("traits", C.c_uint32)]


class MetadataExt(C.Structure):
    _fields_ = [("base", Ext), ("metadata", C.POINTER(Metadata))]


class Buffer(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("dtype", C.c_int32), ("data", C.c_void_p),
                ("rank", C.c_int64), ("dims", C.POINTER(C.c_int64))]


class List(C.Structure):  # XLA_FFI_Args and XLA_FFI_Rets
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("size", C.c_int64),
                ("types", C.POINTER(C.c_int32)), ("items", C.POINTER(C.POINTER(Buffer)))]


class Bytes(C.Structure):
    _fields_ = [("ptr", C.c_void_p), ("len", C.c_size_t)]


class Array(C.Structure):
    _fields_ = [("dtype", C.c_int32), ("size", C.c_size_t), ("data", C.c_void_p)]


class Attrs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("size", C.c_int64),
                ("types", C.POINTER(C.c_int32)), ("names", C.POINTER(C.POINTER(Bytes))),
                ("attrs", C.POINTER(C.c_void_p))]


class ErrorArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("message", C.c_char_p), ("code", C.c_int32)]


class StreamArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("ctx", C.c_void_p), ("stream", C.c_void_p)]


ERROR_CREATE = C.CFUNCTYPE(C.c_void_p, C.POINTER(ErrorArgs))
STREAM_GET = C.CFUNCTYPE(C.c_void_p, C.POINTER(StreamArgs))


class Api(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.c_void_p), ("api_version", Version),
                ("internal", C.c_void_p), ("error_create", ERROR_CREATE), ("get_message", C.c_void_p),
                ("destroy", C.c_void_p), ("register", C.c_void_p), ("stream_get", STREAM_GET)]


class Frame(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("ext", C.POINTER(Ext)), ("api", C.POINTER(Api)),
                ("ctx", C.c_void_p), ("stage", C.c_int32), ("args", List), ("rets", List), ("attrs", Attrs),
                ("future", C.c_void_p)]


HANDLER = C.CFUNCTYPE(C.c_void_p, C.POINTER(Frame))
METADATA_EXTENSION, EXECUTE, BUFFER, ATTR_ARRAY, ATTR_STRING = 1, 3, 1, 1, 4
S32, S64 = 4, 5
# The sizes XLA writes for the 0.1 layout (up to each struct's last field).
FRAME_SIZE, LIST_SIZE, ATTRS_SIZE, BUFFER_SIZE, API_SIZE = 168, 40, 48, 48, 88


def attributes(frame: "Frame") -> dict:
    """A frame's attributes by name: ARRAY ones as Array structs, STRING ones as bytes."""
    found = {}
    for i in range(frame.attrs.size):
        name = frame.attrs.names[i].contents
        value = frame.attrs.attrs[i]
        if frame.attrs.types[i] == ATTR_STRING:
            span = C.cast(value, C.POINTER(Bytes)).contents
            found[C.string_at(name.ptr, name.len)] = C.string_at(span.ptr, span.len)
        else:
            found[C.string_at(name.ptr, name.len)] = C.cast(value, C.POINTER(Array)).contents
    return found


def metadata_frame():
    """(frame, metadata) of the query XLA makes when a handler is registered."""
    meta = Metadata(C.sizeof(Metadata), Version(C.sizeof(Version)))
    ext = MetadataExt(Ext(C.sizeof(MetadataExt), METADATA_EXTENSION, None), C.pointer(meta))
    frame = Frame(struct_size=FRAME_SIZE, ext=C.cast(C.pointer(ext), C.POINTER(Ext)))
    frame._keep = (meta, ext)
    return frame, meta


class FakeApi:
    """XLA's API table for a hand-built frame: error_create records (code, message) and returns a
    non-null handle, stream_get hands out `stream`."""

    def __init__(self, stream: int = 0x5000):
        self.errors, self.stream = [], stream

        def create(args):
            self.errors.append((args.contents.code, args.contents.message.decode()))
            return 0x1234

        def get_stream(args):
            args.contents.stream = self.stream
            return None

        self._callbacks = (ERROR_CREATE(create), STREAM_GET(get_stream))
        self.table = Api(struct_size=API_SIZE, error_create=self._callbacks[0], stream_get=self._callbacks[1])


def frame(api: FakeApi, operands, results, attrs: dict, struct_size: int = FRAME_SIZE):
    """An execution frame: `operands` and `results` as (data pointer, shape) pairs, `attrs` a dict
    of NumPy arrays (int32 / int64) and strings, passed in name order as XLA does."""
    keep = []

    def buffers(pairs):
        items = (C.POINTER(Buffer) * max(1, len(pairs)))()
        types = (C.c_int32 * max(1, len(pairs)))(*([BUFFER] * len(pairs)))
        for i, (ptr, shape) in enumerate(pairs):
            dims = (C.c_int64 * max(1, len(shape)))(*shape)
            b = Buffer(BUFFER_SIZE, None, 0, ptr, len(shape), dims)
            keep.extend((dims, b))
            items[i] = C.pointer(b)
        keep.extend((items, types))
        return List(LIST_SIZE, None, len(pairs), types, items)

    names = sorted(attrs)
    n = len(names)
    name_ptrs, values, types = (C.POINTER(Bytes) * max(1, n))(), (C.c_void_p * max(1, n))(), (C.c_int32 * max(1, n))()
    for i, name in enumerate(names):
        raw = name.encode()
        keep.append(raw)
        span = Bytes(C.cast(C.c_char_p(raw), C.c_void_p), len(raw))
        keep.append(span)
        name_ptrs[i] = C.pointer(span)
        value = attrs[name]
        if isinstance(value, str):
            data = value.encode()
            item = Bytes(C.cast(C.c_char_p(data), C.c_void_p), len(data))
            keep.extend((data, item))
            types[i] = ATTR_STRING
        else:
            arr = np.ascontiguousarray(value)
            item = Array(S32 if arr.dtype == np.int32 else S64, arr.size, arr.ctypes.data)
            keep.extend((arr, item))
            types[i] = ATTR_ARRAY
        values[i] = C.cast(C.pointer(item), C.c_void_p)
    keep.extend((name_ptrs, values, types))
    f = Frame(struct_size=struct_size, ext=None, api=C.pointer(api.table), ctx=None, stage=EXECUTE,
              args=buffers(operands), rets=buffers(results),
              attrs=Attrs(ATTRS_SIZE, None, n, types, name_ptrs, values))
    f._keep = keep
    return f
