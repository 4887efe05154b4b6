// The two wgmma products a wgmma K2 would issue, read from the shared-memory layouts K2 and K1
// already use, compared bit for bit with the m16n8k16 products K2 computes today.
// (docs/speed_limits.md, "A wgmma K2"; mma_vs_wgmma.cu showed the accumulation itself matches.)
//
//   Q1, transposed:  u^T[v][t] = sum_k S[v][k] Kd[t][k]       m64n16k16 x 8 k-steps
//     A = S, M = 64 value rows, from K2's S^T image: 8x8 core matrices "rows k, 8 v per row", i.e.
//         MN-major, core (k-block kc, v-block vc) at 128 * (vc + 8 kc)
//     B = Kd, N = 16 tokens, from K1's raw tile image (the ldmatrix.x4 order K2 reads today):
//         K-major, core (t-block tb, k-block kc) at 512 * (kc / 2) + 128 * (tb + 2 (kc % 2))
//   Q5:              D[k][v] = sum_t Kr[t][k] U[t][v]         m64n64k16, two for k = 0..127
//     A = Kr^T, M = k, from the same raw image: MN-major (rows t, 8 k per row)
//     B = U, N = 64 value columns, staged MN-major: core (t-block tb, v-block vc) at 128 * (vc + 8 tb)
//
// For the MN-major descriptors the probe tries both assignments of the two byte offsets (the
// canonical form puts the MN-block stride in SBO and the K-block stride in LBO); a wrong one
// shows up as an error against float64, a rounding difference as a bit mismatch with small error.
//
//   nvcc -gencode arch=compute_90a,code=sm_90a -O2 -o wgmma_k2_layouts ci/probes/wgmma_k2_layouts.cu
//
// Measurement tool only: nothing in the library uses it. Exit status 0 when the canonical
// descriptors give bitwise-equal results in every trial, 1 when their rounding differs, 2 when
// one of them is wrong (error above 1e-3 of sum |p|).
#include <cuda_bf16.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <vector>

#include "k2_probe_ops.cuh"

constexpr int V = 64;   // value columns of one warpgroup
constexpr int T = 16;   // tokens of one tile
constexpr int K = 128;  // key dimension

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(3); } } while (0)

__device__ __forceinline__ uint32_t pack(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return (uint32_t)__bfloat16_as_ushort(lo) | ((uint32_t)__bfloat16_as_ushort(hi) << 16);
}

__device__ __forceinline__ void mma16816(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// K2 today. Q1: u[t][v] = sum_k Kd[t][k] S[v][k], eight k-steps per 8-value block, fp32 from zero.
// Q5: D[k][v] = sum_t Kr[t][k] U[t][v], one k16 step (tokens) per 16 x 8 block. One warp.
__global__ void mma_reference(const __nv_bfloat16 *S, const __nv_bfloat16 *Kd, const __nv_bfloat16 *Kr,
                              const __nv_bfloat16 *U, float *U1, float *D5) {
  int lane = threadIdx.x, g = lane >> 2, q = lane & 3;
  for (int nb = 0; nb < V / 8; ++nb) {
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    for (int ks = 0; ks < K / 16; ++ks) {
      int k0 = 16 * ks + 2 * q;
      const __nv_bfloat16 *r0 = Kd + g * K, *r1 = Kd + (g + 8) * K, *s = S + (8 * nb + g) * K;
      mma16816(c, pack(r0[k0], r0[k0 + 1]), pack(r1[k0], r1[k0 + 1]), pack(r0[k0 + 8], r0[k0 + 9]),
               pack(r1[k0 + 8], r1[k0 + 9]), pack(s[k0], s[k0 + 1]), pack(s[k0 + 8], s[k0 + 9]));
    }
    int v = 8 * nb + 2 * q;
    U1[g * V + v] = c[0]; U1[g * V + v + 1] = c[1]; U1[(g + 8) * V + v] = c[2]; U1[(g + 8) * V + v + 1] = c[3];
  }
  for (int mb = 0; mb < K / 16; ++mb)
    for (int nb = 0; nb < V / 8; ++nb) {
      float c[4] = {0.f, 0.f, 0.f, 0.f};
      int k = 16 * mb + g, t = 2 * q, v = 8 * nb + g;
      mma16816(c, pack(Kr[t * K + k], Kr[(t + 1) * K + k]), pack(Kr[t * K + k + 8], Kr[(t + 1) * K + k + 8]),
               pack(Kr[(t + 8) * K + k], Kr[(t + 9) * K + k]), pack(Kr[(t + 8) * K + k + 8], Kr[(t + 9) * K + k + 8]),
               pack(U[t * V + v], U[(t + 1) * V + v]), pack(U[(t + 8) * V + v], U[(t + 9) * V + v]));
      int vc = 8 * nb + 2 * q;
      D5[k * V + vc] = c[0]; D5[k * V + vc + 1] = c[1]; D5[(k + 8) * V + vc] = c[2]; D5[(k + 8) * V + vc + 1] = c[3];
    }
}

// Byte offsets of the S^T and U images (bf16 elements); K1's raw image is raw_image (k2_probe_ops.cuh).
__device__ __forceinline__ int st_image(int k, int v) {  // K2's S^T: rows k, 8 v per row
  return 128 * ((v >> 3) + 8 * (k >> 3)) + 16 * (k & 7) + 2 * (v & 7);
}
__device__ __forceinline__ int u_image(int t, int v) {  // U staged rows t, 8 v per row
  return 128 * ((v >> 3) + 8 * (t >> 3)) + 16 * (t & 7) + 2 * (v & 7);
}

#define WG_M64N16(d, da, db, scale_d)                                                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"                                              \
               "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, " \
               "p, 1, 1, 1, 0;\n}\n"                                                                     \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),     \
                 "+f"(d[7])                                                                              \
               : "l"(da), "l"(db), "r"(scale_d))

#define WG_M64N64(d, da, db, scale_d)                                                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                              \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "                                  \
               "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                  \
               "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 1, 1;\n}\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),     \
                 "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
                 "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),           \
                 "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),           \
                 "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])            \
               : "l"(da), "l"(db), "r"(scale_d))

// One warpgroup. swap = 0: canonical MN-major offsets (MN-block stride in SBO, K-block stride in
// LBO); swap = 1: the two exchanged. W1[v][t] = u^T, W5[k][v] = Q5's product.
__global__ void wgmma_products(const __nv_bfloat16 *S, const __nv_bfloat16 *Kd, const __nv_bfloat16 *Kr,
                               const __nv_bfloat16 *U, float *W1, float *W5, int swap) {
  // One block with slack behind the last image: the exchanged offsets (swap = 1) make wgmma read up
  // to 8 KiB past an operand's start (U: 8 MN-blocks 1024 bytes apart), which without the slack
  // runs off the CTA's shared memory and faults instead of giving wrong numbers.
  __shared__ __align__(1024) unsigned char smem[V * K * 2 + 2 * T * K * 2 + T * V * 2 + 16384];
  unsigned char *sS = smem, *sKd = sS + V * K * 2, *sKr = sKd + T * K * 2, *sU = sKr + T * K * 2;
  int tid = threadIdx.x;
  for (int i = tid; i < V * K; i += blockDim.x) {
    int v = i / K, k = i % K;
    *reinterpret_cast<__nv_bfloat16 *>(sS + st_image(k, v)) = S[i];
  }
  for (int i = tid; i < T * K; i += blockDim.x) {
    int t = i / K, k = i % K;
    *reinterpret_cast<__nv_bfloat16 *>(sKd + raw_image(t, k)) = Kd[i];
    *reinterpret_cast<__nv_bfloat16 *>(sKr + raw_image(t, k)) = Kr[i];
  }
  for (int i = tid; i < T * V; i += blockDim.x) {
    int t = i / V, v = i % V;
    *reinterpret_cast<__nv_bfloat16 *>(sU + u_image(t, v)) = U[i];
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  uint32_t aS = (uint32_t)__cvta_generic_to_shared(sS), aKd = (uint32_t)__cvta_generic_to_shared(sKd);
  uint32_t aKr = (uint32_t)__cvta_generic_to_shared(sKr), aU = (uint32_t)__cvta_generic_to_shared(sU);
  // MN-major operands: (MN-block stride, K-block stride) = S^T (128, 1024), Kr^T (256, 128), U (128, 1024)
  auto mn_desc = [swap](uint32_t addr, uint32_t mn_stride, uint32_t k_stride) {
    return swap ? desc(addr, mn_stride, k_stride) : desc(addr, k_stride, mn_stride);
  };

  float d1[8], d5a[32], d5b[32];
  for (int i = 0; i < 8; ++i) d1[i] = 0.f;
  for (int i = 0; i < 32; ++i) d5a[i] = d5b[i] = 0.f;
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  for (int ks = 0; ks < K / 16; ++ks) {
    // A: S^T k-blocks 2 ks, 2 ks + 1 (start + 2048 ks); B: Kd image k16 step ks (start + 512 ks), K-major
    uint64_t da = mn_desc(aS + 2048 * ks, 128, 1024), db = desc(aKd + 512 * ks, 256, 128);
    int scale_d = ks > 0;
    WG_M64N16(d1, da, db, scale_d);
  }
  // Q5: A = Kr^T rows k 0..63 and 64..127 (start + 2048), B = U; one k16 step from zero (scale-d 0)
  WG_M64N64(d5a, mn_desc(aKr, 256, 128), mn_desc(aU, 128, 1024), 0);
  WG_M64N64(d5b, mn_desc(aKr + 2048, 256, 128), mn_desc(aU, 128, 1024), 0);
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");

  // m64nN accumulator: warp w holds rows 16 w + g and + 8; per 8-column block j, d[4 j .. 4 j + 3]
  int w = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3, r0 = 16 * w + g;
  for (int j = 0; j < T / 8; ++j)
    for (int h = 0; h < 4; ++h)
      W1[(r0 + 8 * (h >> 1)) * T + 8 * j + 2 * q + (h & 1)] = d1[4 * j + h];
  for (int j = 0; j < V / 8; ++j)
    for (int h = 0; h < 4; ++h) {
      W5[(r0 + 8 * (h >> 1)) * V + 8 * j + 2 * q + (h & 1)] = d5a[4 * j + h];
      W5[(64 + r0 + 8 * (h >> 1)) * V + 8 * j + 2 * q + (h & 1)] = d5b[4 * j + h];
    }
}

static float draw(int mode, int i) {  // N(0,1); exponents over 2^[-20, 20]; cancelling pairs
  switch (mode) {
    case 0: return (float)normal();
    case 1: return (float)(normal() * ldexp(1.0, (int)(uniform() * 41) - 20));
    default: { double x = normal() * 64; return (float)((i & 1) ? -x + normal() * 1e-2 : x); }
  }
}

struct Compare { int differ = 0; double err_mma = 0, err_wg = 0, scale = 0; };

static void compare(Compare &c, float mma, float wg, double ref, double mag) {
  c.differ += memcmp(&mma, &wg, 4) != 0;
  c.scale = fmax(c.scale, mag);
  c.err_mma = fmax(c.err_mma, fabs(mma - ref));
  c.err_wg = fmax(c.err_wg, fabs(wg - ref));
}

int main() {
  const char *names[3] = {"N(0,1)", "wide exponents", "cancelling pairs"};
  int worst = 0;
  for (int mode = 0; mode < 3; ++mode)
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<__nv_bfloat16> hS(V * K), hKd(T * K), hKr(T * K), hU(T * V);
      for (int i = 0; i < V * K; ++i) hS[i] = __float2bfloat16(draw(mode, i % K));
      for (int i = 0; i < T * K; ++i) hKd[i] = __float2bfloat16(draw(mode, i % K));
      for (int i = 0; i < T * K; ++i) hKr[i] = __float2bfloat16(draw(mode, i / K));  // pairs cancel over t
      for (int i = 0; i < T * V; ++i) hU[i] = __float2bfloat16(draw(mode, i / V));
      __nv_bfloat16 *dS, *dKd, *dKr, *dU; float *dU1, *dD5, *dW1, *dW5;
      CHECK(cudaMalloc(&dS, V * K * 2)); CHECK(cudaMalloc(&dKd, T * K * 2)); CHECK(cudaMalloc(&dKr, T * K * 2));
      CHECK(cudaMalloc(&dU, T * V * 2)); CHECK(cudaMalloc(&dU1, T * V * 4)); CHECK(cudaMalloc(&dD5, K * V * 4));
      CHECK(cudaMalloc(&dW1, 2 * V * T * 4)); CHECK(cudaMalloc(&dW5, 2 * K * V * 4));
      CHECK(cudaMemcpy(dS, hS.data(), V * K * 2, cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(dKd, hKd.data(), T * K * 2, cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(dKr, hKr.data(), T * K * 2, cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(dU, hU.data(), T * V * 2, cudaMemcpyHostToDevice));
      // poisoned: NaN wherever nothing was written
      CHECK(cudaMemset(dU1, 0xFF, T * V * 4)); CHECK(cudaMemset(dD5, 0xFF, K * V * 4));
      CHECK(cudaMemset(dW1, 0xFF, 2 * V * T * 4)); CHECK(cudaMemset(dW5, 0xFF, 2 * K * V * 4));
      mma_reference<<<1, 32>>>(dS, dKd, dKr, dU, dU1, dD5);
      for (int swap = 0; swap < 2; ++swap)
        wgmma_products<<<1, 128>>>(dS, dKd, dKr, dU, dW1 + swap * V * T, dW5 + swap * K * V, swap);
      CHECK(cudaGetLastError()); CHECK(cudaDeviceSynchronize());
      std::vector<float> U1(T * V), D5(K * V), W1(2 * V * T), W5(2 * K * V);
      CHECK(cudaMemcpy(U1.data(), dU1, T * V * 4, cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(D5.data(), dD5, K * V * 4, cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(W1.data(), dW1, 2 * V * T * 4, cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(W5.data(), dW5, 2 * K * V * 4, cudaMemcpyDeviceToHost));
      for (void *p : {(void *)dS, (void *)dKd, (void *)dKr, (void *)dU, (void *)dU1, (void *)dD5, (void *)dW1,
                      (void *)dW5}) cudaFree(p);
      auto f = [](const std::vector<__nv_bfloat16> &a, int i) { return (double)__bfloat162float(a[i]); };
      Compare q1[2], q5[2];
      for (int swap = 0; swap < 2; ++swap) {
        for (int t = 0; t < T; ++t)
          for (int v = 0; v < V; ++v) {
            double ref = 0, mag = 0;
            for (int k = 0; k < K; ++k) { double p = f(hKd, t * K + k) * f(hS, v * K + k); ref += p; mag += fabs(p); }
            compare(q1[swap], U1[t * V + v], W1[swap * V * T + v * T + t], ref, mag);
          }
        for (int k = 0; k < K; ++k)
          for (int v = 0; v < V; ++v) {
            double ref = 0, mag = 0;
            for (int t = 0; t < T; ++t) { double p = f(hKr, t * K + k) * f(hU, t * V + v); ref += p; mag += fabs(p); }
            compare(q5[swap], D5[k * V + v], W5[swap * K * V + k * V + v], ref, mag);
          }
      }
      auto wrong = [](const Compare &c) { return !(c.err_mma <= 1e-3 * c.scale && c.err_wg <= 1e-3 * c.scale); };
      bool bad = wrong(q1[0]) || wrong(q5[0]);
      if (trial < 2 || bad || q1[0].differ || q5[0].differ)
        printf("%-17s trial %2d: canonical offsets: Q1 %4d / %d differ (err %.2e / %.2e), Q5 %4d / %d differ "
               "(err %.2e / %.2e)%s; swapped offsets: Q1 err %.2e, Q5 err %.2e\n",
               names[mode], trial, q1[0].differ, T * V, q1[0].err_mma / q1[0].scale, q1[0].err_wg / q1[0].scale,
               q5[0].differ, K * V, q5[0].err_mma / q5[0].scale, q5[0].err_wg / q5[0].scale, bad ? " WRONG" : "",
               q1[1].err_wg / q1[1].scale, q5[1].err_wg / q5[1].scale);
      if (bad) worst = 2;
      else if ((q1[0].differ || q5[0].differ) && worst < 1) worst = 1;
    }
  printf(worst == 0 ? "canonical offsets: bitwise equal in every trial\n"
                    : worst == 1 ? "canonical offsets: rounding differs\n" : "canonical offsets: a result is wrong\n");
  return worst;
}
