/* The part of XLA's FFI C API (xla/ffi/api/c_api.h, API version 0.1) that kda_xla.c uses, declared
 * here so the build needs no jaxlib or XLA headers. Every struct XLA hands over starts with its
 * size "up to its last 0.1 field" (XLA's STRUCT_SIZE convention); later API versions only append
 * fields, so a struct at least that large has the layout below. The offsets asserted at the end
 * are those of the 0.1 layout on LP64, which is what XLA was compiled with. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define KDA_XLA_API_MAJOR 0
#define KDA_XLA_API_MINOR 1

/* The size of `type` up to and including `field`: the value XLA writes into struct_size. */
#define KDA_XLA_SIZE_UPTO(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))

typedef struct kda_xla_error kda_xla_error; /* XLA_FFI_Error: opaque, owned by XLA once returned */
typedef struct kda_xla_context kda_xla_context; /* XLA_FFI_ExecutionContext: opaque */

typedef struct kda_xla_extension { /* XLA_FFI_Extension_Base: a linked list of typed extensions */
  size_t struct_size;
  int32_t type; /* XLA_FFI_Extension_Type (a C enum) */
  struct kda_xla_extension *next;
} kda_xla_extension;
#define KDA_XLA_EXTENSION_METADATA 1

typedef struct { /* XLA_FFI_Api_Version */
  size_t struct_size;
  kda_xla_extension *extension_start;
  int32_t major_version;
  int32_t minor_version;
} kda_xla_version;

typedef struct { /* XLA_FFI_Metadata: filled by a handler asked for it at registration */
  size_t struct_size;
  kda_xla_version api_version;
  uint32_t traits; /* XLA_FFI_Handler_Traits */
} kda_xla_metadata;
#define KDA_XLA_TRAIT_COMMAND_BUFFER_COMPATIBLE 1u

typedef struct { /* XLA_FFI_Metadata_Extension */
  kda_xla_extension base;
  kda_xla_metadata *metadata;
} kda_xla_metadata_extension;

typedef struct { /* XLA_FFI_Error_Create_Args */
  size_t struct_size;
  kda_xla_extension *extension_start;
  const char *message; /* copied by XLA */
  int32_t code;        /* XLA_FFI_Error_Code: absl's status codes */
} kda_xla_error_args;
#define KDA_XLA_INVALID_ARGUMENT 3
#define KDA_XLA_FAILED_PRECONDITION 9
#define KDA_XLA_INTERNAL 13

typedef struct { /* XLA_FFI_Stream_Get_Args */
  size_t struct_size;
  kda_xla_extension *extension_start;
  kda_xla_context *ctx;
  void *stream; /* out: the CUstream (cudaStream_t) of the execution */
} kda_xla_stream_args;

typedef struct { /* XLA_FFI_Api: only the members up to the stream getter are used */
  size_t struct_size;
  kda_xla_extension *extension_start;
  kda_xla_version api_version;
  void *internal_api;
  kda_xla_error *(*error_create)(kda_xla_error_args *);
  void (*error_get_message)(void *);
  void (*error_destroy)(void *);
  void *(*handler_register)(void *);
  kda_xla_error *(*stream_get)(kda_xla_stream_args *);
} kda_xla_api;

typedef struct { /* XLA_FFI_Buffer: one array argument or result */
  size_t struct_size;
  kda_xla_extension *extension_start;
  int32_t dtype; /* XLA_FFI_DataType */
  void *data;
  int64_t rank;
  int64_t *dims;
} kda_xla_buffer;
#define KDA_XLA_BUFFER 1 /* XLA_FFI_ArgType_BUFFER and XLA_FFI_RetType_BUFFER */

typedef struct { /* XLA_FFI_Args and XLA_FFI_Rets share this layout */
  size_t struct_size;
  kda_xla_extension *extension_start;
  int64_t size;
  int32_t *types; /* KDA_XLA_BUFFER for every array */
  void **items;   /* kda_xla_buffer * each */
} kda_xla_list;

typedef struct { const char *ptr; size_t len; } kda_xla_bytes; /* XLA_FFI_ByteSpan: not terminated */

typedef struct { /* XLA_FFI_Array: a dense array attribute */
  int32_t dtype;
  size_t size;
  void *data;
} kda_xla_array;
#define KDA_XLA_ATTR_ARRAY 1
#define KDA_XLA_ATTR_STRING 4
#define KDA_XLA_S32 4
#define KDA_XLA_S64 5

typedef struct { /* XLA_FFI_Attrs: sorted by name */
  size_t struct_size;
  kda_xla_extension *extension_start;
  int64_t size;
  int32_t *types;
  kda_xla_bytes **names;
  void **attrs; /* kda_xla_array * (ARRAY) or kda_xla_bytes * (STRING) */
} kda_xla_attrs;

typedef struct { /* XLA_FFI_CallFrame */
  size_t struct_size;
  kda_xla_extension *extension_start;
  const kda_xla_api *api;
  kda_xla_context *ctx;
  int32_t stage; /* XLA_FFI_ExecutionStage */
  kda_xla_list args;
  kda_xla_list rets;
  kda_xla_attrs attrs;
  void *future;
} kda_xla_frame;
#define KDA_XLA_STAGE_EXECUTE 3

/* The 0.1 layout, as XLA's headers define it (LP64). */
_Static_assert(sizeof(void *) == 8, "XLA's FFI layouts below are those of LP64");
_Static_assert(offsetof(kda_xla_metadata, traits) == 32, "XLA_FFI_Metadata.traits");
_Static_assert(offsetof(kda_xla_api, error_create) == 48, "XLA_FFI_Api.XLA_FFI_Error_Create");
_Static_assert(offsetof(kda_xla_api, stream_get) == 80, "XLA_FFI_Api.XLA_FFI_Stream_Get");
_Static_assert(KDA_XLA_SIZE_UPTO(kda_xla_buffer, dims) == 48, "XLA_FFI_Buffer");
_Static_assert(offsetof(kda_xla_frame, args) == 40 && offsetof(kda_xla_frame, rets) == 80, "XLA_FFI_CallFrame");
_Static_assert(KDA_XLA_SIZE_UPTO(kda_xla_frame, attrs) == 168, "XLA_FFI_CallFrame");
_Static_assert(KDA_XLA_SIZE_UPTO(kda_xla_error_args, code) == 28, "XLA_FFI_Error_Create_Args");
