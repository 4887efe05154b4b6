// The floor of one K2 tile step under FlashKDA's recipe: the state chain alone
// (docs/speed_limits.md, "The state chain's floor").
//
// K2's step (build_kernels/kernels/k2_recurrence.py) is Q1 -> Q2 -> Q3 -> Q5, each on the one
// before, and the next step's Q1 reads the state Q5 wrote. This probe runs exactly that chain with
// everything that does not depend on the state already in registers: the Kd, Qd, Kr^T, INV and Mqk
// fragments, v, bsig and gamma are loaded once, before the loop. So there is no producer, no stage
// barrier, no operand read from the stage and no global traffic but the output stores. What is
// left is what no schedule can hide:
//   Q5's state stores (32-bit, K2's S^T image)   -> __syncwarp ->
//   Q1: ldmatrix.trans of the new S^T, 8 dependent m16n8k16 per accumulator (u and o1) ->
//   Q2: bf(bf(v - bf(u)) * bsig), movmatrix -> Q3: INV r (one MMA), bf16, movmatrix ->
//   Q4: Mqk U, output stored (off the chain) ; Q5: Kr^T U per 16 keys, fma with gamma, bf16, stored.
// Per warp: 8 value columns (VB=64, 8 MMA warps per CTA, as the default H=64 [8192] kernel runs).
// The accumulation order is FlashKDA's, which the bitwise contract fixes: the eight k-steps of one
// accumulator stay one chain.
//
// It times STEPS steps with one CTA per SM (K2 at VB=64 runs so) and prints microseconds per step,
// the latency of one step of the chain. Measured K2, for comparison:
// 0.93 us per step at H=64 [8192] (478 us / 512 steps, docs/k2_schedule.md).
//
//   nvcc -gencode arch=compute_90a,code=sm_90a -O3 -o k2_chain_floor ci/probes/k2_chain_floor.cu && ./k2_chain_floor
//
// Measurement tool only: nothing in the library uses it. The values are random and the state is
// allowed to grow: no instruction here has data-dependent latency.
#include <cuda_bf16.h>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "k2_probe_ops.cuh"

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); return 3; } } while (0)

constexpr int WARPS = 8;      // MMA warps per CTA (VB=64)
constexpr int STEPS = 512;    // H=64 [8192]: 512 tiles per CTA
constexpr int KB = 8;         // k-steps of Q1 (128 keys / 16)

__device__ __forceinline__ uint32_t movt(uint32_t x) {
  uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(x));
  return r;
}
__device__ __forceinline__ void ldsm_t(uint32_t *r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void sts(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;" :: "r"(addr), "r"(v) : "memory");
}

__global__ void __launch_bounds__(32 * WARPS, 1) chain(const uint32_t *seed, uint32_t *out, int steps) {
  __shared__ __align__(128) uint32_t state[WARPS * 128 * 8 / 2];  // S^T, 8 columns x 128 keys per warp, bf16
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t *src = seed + (blockIdx.x * blockDim.x + threadIdx.x) * 128;
  // stage-only operands, once: Kd, Qd (8 k-steps x 4 words each), Kr^T (8 m-blocks), INV, Mqk, v, bsig, gamma
  uint32_t a_k[KB][4], a_q[KB][4], a_kr[KB][4], a_inv[4], a_mqk[4];
#pragma unroll
  for (int i = 0; i < KB; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) { a_k[i][j] = src[4 * i + j]; a_q[i][j] = src[32 + 4 * i + j]; a_kr[i][j] = src[64 + 4 * i + j]; }
#pragma unroll
  for (int j = 0; j < 4; ++j) { a_inv[j] = src[96 + j]; a_mqk[j] = src[100 + j]; }
  uint32_t v0 = src[104], v1 = src[105];
  float bs0 = lo16(src[106]), bs1 = hi16(src[106]);
  float gam[KB][2];
#pragma unroll
  for (int i = 0; i < KB; ++i) { gam[i][0] = lo16(src[107 + i]); gam[i][1] = hi16(src[107 + i]); }
  // this lane's state words (Q5's C-fragment positions), in registers and in the S^T image
  uint32_t region = (uint32_t)__cvta_generic_to_shared(state) + warp * (128 * 8 * 2);
  uint32_t st[KB][2];
#pragma unroll
  for (int mb = 0; mb < KB; ++mb) {
    st[mb][0] = src[115 + (mb & 3)]; st[mb][1] = src[119 + (mb & 3)];
    sts(region + 256 * mb + 4 * lane, st[mb][0]);
    sts(region + 256 * mb + 128 + 4 * lane, st[mb][1]);
  }
  __syncwarp();
  uint32_t *o = out + (blockIdx.x * blockDim.x + threadIdx.x) * 2;
  for (int step = 0; step < steps; ++step) {
    // Q1: u, o1 = Kd S^T, Qd S^T from the state just written
    float u[4] = {0.f, 0.f, 0.f, 0.f}, o1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int kb = 0; kb < KB; kb += 2) {
      uint32_t b[4];
      ldsm_t(b, region + 256 * kb + 16 * lane);
      mma(u, a_k[kb], b[0], b[1]); mma(o1, a_q[kb], b[0], b[1]);
      mma(u, a_k[kb + 1], b[2], b[3]); mma(o1, a_q[kb + 1], b[2], b[3]);
    }
    __syncwarp();  // Q1's reads of other lanes' words before Q5 overwrites them
    // Q2: r = bf(bf(v - bf(u)) * bsig), as B fragment
    uint32_t ub0 = bf2(u[0], u[1]), ub1 = bf2(u[2], u[3]);
    uint32_t d0 = bf2(lo16(v0) - lo16(ub0), hi16(v0) - hi16(ub0)), d1 = bf2(lo16(v1) - lo16(ub1), hi16(v1) - hi16(ub1));
    uint32_t r0 = movt(bf2(lo16(d0) * bs0, hi16(d0) * bs0)), r1 = movt(bf2(lo16(d1) * bs1, hi16(d1) * bs1));
    // Q3: U = bf(INV r), as B fragment
    float uu[4] = {0.f, 0.f, 0.f, 0.f};
    mma(uu, a_inv, r0, r1);
    uint32_t U0 = movt(bf2(uu[0], uu[1])), U1 = movt(bf2(uu[2], uu[3]));
    // Q4: out = bf(bf(o1) + bf(Mqk U)), stored (off the chain)
    float o2[4] = {0.f, 0.f, 0.f, 0.f};
    mma(o2, a_mqk, U0, U1);
    uint32_t p0 = bf2(o1[0], o1[1]), p1 = bf2(o1[2], o1[3]), q0 = bf2(o2[0], o2[1]), q1 = bf2(o2[2], o2[3]);
    o[0] = bf2(lo16(p0) + lo16(q0), hi16(p0) + hi16(q0));
    o[1] = bf2(lo16(p1) + lo16(q1), hi16(p1) + hi16(q1));
    // Q5: S^T = bf(fma(S^T, gamma, Kr^T U)), 8 m-blocks, stored for the next Q1
#pragma unroll
    for (int mb = 0; mb < KB; ++mb) {
      float ds[4] = {0.f, 0.f, 0.f, 0.f};
      mma(ds, a_kr[mb], U0, U1);
      st[mb][0] = bf2(fmaf(lo16(st[mb][0]), gam[mb][0], ds[0]), fmaf(hi16(st[mb][0]), gam[mb][0], ds[1]));
      st[mb][1] = bf2(fmaf(lo16(st[mb][1]), gam[mb][1], ds[2]), fmaf(hi16(st[mb][1]), gam[mb][1], ds[3]));
      sts(region + 256 * mb + 4 * lane, st[mb][0]);
      sts(region + 256 * mb + 128 + 4 * lane, st[mb][1]);
    }
    __syncwarp();  // the new state visible to the warp's next Q1
  }
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int threads = 32 * WARPS, max_ctas = sms;
  std::vector<uint32_t> h((size_t)max_ctas * threads * 128);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (auto &w : h) {  // bf16 pairs of N(0,1)-ish magnitude: exponents 120..127, random mantissas
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    uint64_t r = x * 2685821657736338717ull;
    auto half = [](uint64_t b) { return (uint32_t)(((b & 1) << 15) | ((120 + (b >> 1) % 8) << 7) | ((b >> 4) & 0x7F)); };
    w = half(r >> 8) | (half(r >> 32) << 16);
  }
  uint32_t *seed, *out;
  CHECK(cudaMalloc(&seed, h.size() * 4));
  CHECK(cudaMalloc(&out, (size_t)max_ctas * threads * 2 * 4));
  CHECK(cudaMemcpy(seed, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0)); CHECK(cudaEventCreate(&e1));
  {
    int ctas = sms;
    chain<<<ctas, threads>>>(seed, out, 8);  // warm up
    CHECK(cudaGetLastError()); CHECK(cudaDeviceSynchronize());
    float best = 1e30f;
    for (int rep = 0; rep < 10; ++rep) {
      CHECK(cudaEventRecord(e0));
      chain<<<ctas, threads>>>(seed, out, STEPS);
      CHECK(cudaEventRecord(e1)); CHECK(cudaEventSynchronize(e1));
      float ms = 0.f;
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      best = ms < best ? ms : best;
    }
    printf("one CTA per SM (%d CTAs of %d threads): %d steps in %.1f us: %.3f us per step\n", ctas, threads,
           STEPS, best * 1e3, best * 1e3 / STEPS);
  }
  return 0;
}
