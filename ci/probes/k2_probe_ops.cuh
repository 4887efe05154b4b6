// What the K2 probes share (k2_chain_floor.cu, wgmma_k2_layouts.cu, k2_wgmma_chain.cu): K2's
// m16n8k16 and bf16 packing forms, K1's raw tile image, the no-swizzle wgmma descriptor, and the
// host's random numbers. Measurement tools only: nothing in the library uses them.
#pragma once
#include <cmath>
#include <cstdint>

// D += A B, bf16 inputs, fp32 accumulate; a: the A fragment's 4 words (PTX ISA, "mma.m16n8k16")
__device__ __forceinline__ void mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t bf2(float lo, float hi) {  // cvt.rn.bf16x2: one rounding each
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ float lo16(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi16(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

// K1's raw tile image (the ldmatrix.x4 order K2 reads): byte offset of token t, key k
__device__ __forceinline__ int raw_image(int t, int k) {
  return 512 * (k >> 4) + 128 * ((t >> 3) + 2 * ((k >> 3) & 1)) + 16 * (t & 7) + 2 * (k & 7);
}
// wgmma matrix descriptor of a no-swizzle operand: address, leading and stride byte offsets
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr >> 4) & 0x3FFF) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
         ((uint64_t)((sbo >> 4) & 0x3FFF) << 32);  // base offset 0, no swizzle
}

// Host random numbers: xorshift64*, one fixed seed per process
static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static double uniform() {  // in (0, 1)
  rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
  return ((rng_state * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0) + 1e-300;
}
static double normal() { return sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform()); }
