/* kda_xla_prefill: the XLA FFI handler behind kda_aot.jax.prefill (docs/frameworks.md, "jax.jit").
 *
 * Python builds the call's kernel program while JAX traces (shapes are static under jit) and hands
 * it to this handler as the custom call's attributes, so a compiled executable carries its own
 * program and nothing here depends on state kept in Python:
 *   steps   s32 [4 n]  the program's steps (kda_step rows)
 *   slots   s64 [2 m]  its argument slots (kda_slot rows)
 *   inputs  s32 [4]    size of the pointer vector, workspace slot, workspace alignment, stream slot
 *   buffers s32 [a+r]  the pointer-vector slot each operand, then each result, fills (-1: none)
 *   align   s64 [a+r]  the alignment mask each of them must clear (the wall's table)
 *   names   string     their names, comma-separated, for errors
 * The handler only patches this execution's buffer addresses and XLA's stream into the pointer
 * vector and runs the program, as kda_run does for an eager call. It never synchronises or reads
 * device memory, and launches the same kernels for the same attributes, which is what XLA asks of
 * a handler it may trace into a command buffer (CUDA graph). */
#include <stdio.h>
#include <string.h>

#include "cuda_abi.h"
#include "kda_program.h"
#include "xla_ffi_abi.h"

#define KDA_API __attribute__((visibility("default")))
#define KDA_XLA_MAX_INPUTS 64 /* room for the pointer vector (program.INPUTS, 20 today) */

const char *kda_kernel_name(int32_t i);

/* What a frame must hold to have the 0.1 layout: anything smaller comes from an XLA older than
 * the FFI this handler is written for (JAX 0.5 is the first release with jax.ffi and API 0.1). */
static const char kda_xla_too_old[] =
    "kda_aot.jax: this XLA passes FFI structures older than XLA FFI API 0.1; JAX 0.5 or newer is needed";

static kda_xla_error *kda_xla_fail(const kda_xla_frame *frame, int32_t code, const char *message) {
  kda_xla_error_args args;
  memset(&args, 0, sizeof args);
  args.struct_size = KDA_XLA_SIZE_UPTO(kda_xla_error_args, code);
  args.message = message;
  args.code = code;
  return frame->api->error_create(&args);
}

static int kda_xla_name_is(const kda_xla_bytes *name, const char *want) {
  size_t n = strlen(want);
  return name->len == n && memcmp(name->ptr, want, n) == 0;
}

/* The i-th comma-separated name, for an error message. */
static void kda_xla_buffer_name(const kda_xla_bytes *names, int64_t i, char *out, size_t size) {
  size_t n = 0;
  if (names) {
    size_t p = 0;
    for (int64_t k = 0; k < i && p < names->len; ++p)
      if (names->ptr[p] == ',') ++k;
    for (; p + n < names->len && names->ptr[p + n] != ',' && n + 1 < size; ++n) out[n] = names->ptr[p + n];
  }
  out[n] = 0;
}

static int64_t kda_xla_numel(const kda_xla_buffer *b) {
  int64_t n = 1;
  for (int64_t d = 0; d < b->rank; ++d) n *= b->dims[d];
  return n;
}

KDA_API kda_xla_error *kda_xla_prefill(kda_xla_frame *frame) {
  /* Registration asks for the API version and traits through the metadata extension (no api). */
  const kda_xla_extension *ext = frame->extension_start;
  if (ext && ext->type == KDA_XLA_EXTENSION_METADATA) {
    kda_xla_metadata *meta = ((const kda_xla_metadata_extension *)ext)->metadata;
    meta->api_version.major_version = KDA_XLA_API_MAJOR;
    meta->api_version.minor_version = KDA_XLA_API_MINOR;
    if (meta->struct_size >= KDA_XLA_SIZE_UPTO(kda_xla_metadata, traits))
      meta->traits = KDA_XLA_TRAIT_COMMAND_BUFFER_COMPATIBLE;
    return 0;
  }
  /* Without XLA's API no error can be reported, and returning success would hand back outputs
   * that were never written; every XLA with FFI passes it. */
  if (!frame->api || frame->api->struct_size < KDA_XLA_SIZE_UPTO(kda_xla_api, error_create)) __builtin_trap();
  if (frame->struct_size < KDA_XLA_SIZE_UPTO(kda_xla_frame, attrs) ||
      frame->api->struct_size < KDA_XLA_SIZE_UPTO(kda_xla_api, stream_get) ||
      frame->args.struct_size < KDA_XLA_SIZE_UPTO(kda_xla_list, items) ||
      frame->rets.struct_size < KDA_XLA_SIZE_UPTO(kda_xla_list, items) ||
      frame->attrs.struct_size < KDA_XLA_SIZE_UPTO(kda_xla_attrs, attrs))
    return kda_xla_fail(frame, KDA_XLA_FAILED_PRECONDITION, kda_xla_too_old);
  if (frame->stage != KDA_XLA_STAGE_EXECUTE) return 0; /* registered for execution only */

  const kda_xla_array *steps = 0, *slots = 0, *inputs = 0, *buffers = 0, *align = 0;
  const kda_xla_bytes *names = 0;
  for (int64_t i = 0; i < frame->attrs.size; ++i) {
    const kda_xla_bytes *name = frame->attrs.names[i];
    void *attr = frame->attrs.attrs[i];
    if (frame->attrs.types[i] == KDA_XLA_ATTR_STRING) {
      if (kda_xla_name_is(name, "names")) names = attr;
      continue;
    }
    if (frame->attrs.types[i] != KDA_XLA_ATTR_ARRAY) continue;
    const kda_xla_array *a = attr;
    if (kda_xla_name_is(name, "steps") && a->dtype == KDA_XLA_S32) steps = a;
    else if (kda_xla_name_is(name, "slots") && a->dtype == KDA_XLA_S64) slots = a;
    else if (kda_xla_name_is(name, "inputs") && a->dtype == KDA_XLA_S32) inputs = a;
    else if (kda_xla_name_is(name, "buffers") && a->dtype == KDA_XLA_S32) buffers = a;
    else if (kda_xla_name_is(name, "align") && a->dtype == KDA_XLA_S64) align = a;
  }
  int64_t n_buffers = frame->args.size + frame->rets.size;
  if (!steps || !slots || !inputs || !buffers || !align || inputs->size != 4 || steps->size % 4 ||
      slots->size % 2 || (int64_t)buffers->size != n_buffers || (int64_t)align->size != n_buffers)
    return kda_xla_fail(frame, KDA_XLA_INVALID_ARGUMENT,
                        "kda_aot.jax: the custom call's attributes are not kda_aot.jax.prefill's "
                        "(call it through kda_aot.jax.prefill)");
  const int32_t *io = inputs->data;
  int32_t n_inputs = io[0], ws_slot = io[1], stream_slot = io[3];
  uint64_t ws_align = (uint64_t)io[2];
  if (n_inputs <= 0 || n_inputs > KDA_XLA_MAX_INPUTS || stream_slot < 0 || stream_slot >= n_inputs ||
      ws_align == 0 || (ws_align & (ws_align - 1)))
    return kda_xla_fail(frame, KDA_XLA_INVALID_ARGUMENT, "kda_aot.jax: bad pointer-vector attributes");

  uint64_t vector[KDA_XLA_MAX_INPUTS];
  memset(vector, 0, sizeof vector);
  const int32_t *slot_of = buffers->data;
  const int64_t *mask_of = align->data;
  for (int64_t i = 0; i < n_buffers; ++i) {
    const kda_xla_list *list = i < frame->args.size ? &frame->args : &frame->rets;
    int64_t j = i < frame->args.size ? i : i - frame->args.size;
    if (list->types[j] != KDA_XLA_BUFFER) continue;
    const kda_xla_buffer *b = list->items[j];
    int32_t slot = slot_of[i];
    if (slot < 0) continue;
    if (slot >= n_inputs || b->struct_size < KDA_XLA_SIZE_UPTO(kda_xla_buffer, dims))
      return kda_xla_fail(frame, KDA_XLA_INVALID_ARGUMENT, "kda_aot.jax: bad buffer attributes");
    uint64_t ptr = (uint64_t)(uintptr_t)b->data;
    if (slot == ws_slot) {
      /* XLA aligns its buffers to less than the workspace needs: the result is ws_align bytes
       * larger than the program's workspace, and the program gets its first aligned byte. */
      ptr = (ptr + ws_align - 1) & ~(ws_align - 1);
    } else if ((ptr & (uint64_t)mask_of[i]) && kda_xla_numel(b) > 0) {
      char name[64], message[256];
      kda_xla_buffer_name(names, i, name, sizeof name);
      snprintf(message, sizeof message,
               "kda_aot.jax: %s: data pointer 0x%llx is not %lld-byte aligned; the kernels read it in "
               "units of that size", name, (unsigned long long)ptr, (long long)mask_of[i] + 1);
      return kda_xla_fail(frame, KDA_XLA_INVALID_ARGUMENT, message);
    }
    vector[slot] = ptr;
  }
  kda_xla_stream_args stream;
  memset(&stream, 0, sizeof stream);
  stream.struct_size = KDA_XLA_SIZE_UPTO(kda_xla_stream_args, stream);
  stream.ctx = frame->ctx;
  kda_xla_error *error = frame->api->stream_get(&stream);
  if (error) return error;
  vector[stream_slot] = (uint64_t)(uintptr_t)stream.stream;

  /* XLA runs an executable with its device's context current, and the library's runtime launches
   * on the current context: no device switch, unlike kda_run. */
  const kda_step *program = steps->data;
  int32_t code = kda_run_program(program, (int32_t)(steps->size / 4), slots->data, (int32_t)(slots->size / 2),
                                 vector, n_inputs);
  if (code == 0) return 0;
  int32_t step = code >> 16, err = code & 0xFFFF;
  char message[256];
  const char *kernel = step < (int32_t)(steps->size / 4) ? kda_kernel_name(program[step].kernel) : 0;
  snprintf(message, sizeof message, "kda_aot.jax: kernel %s: CUDA error %d (%s: %s)", kernel ? kernel : "?", err,
           cudaGetErrorName(err), cudaGetErrorString(err));
  return kda_xla_fail(frame, KDA_XLA_INTERNAL, message);
}
