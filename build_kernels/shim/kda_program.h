/* A prefill's kernel program as kda_run and the XLA handler (kda_xla.c) receive it: built once per
 * problem shape by kda_aot/plan/program.py (its STEP_DTYPE and SLOT_DTYPE are these rows). */
#pragma once
#include <stdint.h>

typedef struct { int32_t kernel, first, count, reserved; } kda_step;
typedef struct { int32_t src, reserved; int64_t add; } kda_slot;

/* Launches every step on the current device; `inputs` holds the call's pointers and stream.
 * Returns 0, or the failing step's CUDA error with the step's index in bits 16 and up. */
int32_t kda_run_program(const kda_step *steps, int32_t n_steps, const kda_slot *slots, int32_t n_slots,
                        const uint64_t *inputs, int32_t n_inputs);
