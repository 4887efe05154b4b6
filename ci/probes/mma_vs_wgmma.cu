// Does wgmma accumulate bit for bit like a chain of mma.sync.m16n8k16? (docs/speed_limits.md)
//
// K2's Q1 computes u[t, v] = sum_k Kd[t, k] S[v, k] as eight chained m16n8k16 MMAs (fp32
// accumulator, k ascending), and that rounding is part of the FlashKDA recipe we match bit for
// bit. A wgmma K2 would compute the same product either transposed (M = value columns: A = S,
// B = Kd) or with the tokens padded to M = 64. This probe computes all three on one GPU, from the
// same bf16 inputs, and counts the fp32 results that differ. It also reports each result's
// largest error against a float64 product, so that a layout mistake in the probe shows up as a
// large error rather than as a rounding difference.
//
//   nvcc -arch=sm_90a -O2 -o mma_vs_wgmma ci/probes/mma_vs_wgmma.cu && ./mma_vs_wgmma
//
// Measurement tool only: nothing in the library uses it. Exit status 0 when every comparison is
// bitwise equal, 1 when some differ, 2 when a result is wrong (error above 1e-3 relative).
#include <cuda_bf16.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>

constexpr int V = 64;   // value columns (wgmma M of the transposed form)
constexpr int T = 16;   // tokens of one tile
constexpr int K = 128;  // key dimension

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(3); } } while (0)

__device__ __forceinline__ uint32_t pack2(const __nv_bfloat16 *row, int k) {
  // two consecutive k values of one row, lower k in the low half (the mma fragment convention)
  uint16_t lo = *reinterpret_cast<const uint16_t *>(row + k);
  uint16_t hi = *reinterpret_cast<const uint16_t *>(row + k + 1);
  return (uint32_t)lo | ((uint32_t)hi << 16);
}

// C1[t][v] = sum_k Y[t][k] X[v][k]: K2's form. One warp, eight n-blocks of 8 values, each an
// eight-step chain over k.
__global__ void mma_chain(const __nv_bfloat16 *X, const __nv_bfloat16 *Y, float *C1) {
  int lane = threadIdx.x, g = lane >> 2, q = lane & 3;
  for (int nb = 0; nb < V / 8; ++nb) {
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    for (int ks = 0; ks < K / 16; ++ks) {
      int k0 = ks * 16;
      uint32_t a0 = pack2(Y + g * K, k0 + 2 * q), a1 = pack2(Y + (g + 8) * K, k0 + 2 * q);
      uint32_t a2 = pack2(Y + g * K, k0 + 8 + 2 * q), a3 = pack2(Y + (g + 8) * K, k0 + 8 + 2 * q);
      const __nv_bfloat16 *xrow = X + (nb * 8 + g) * K;
      uint32_t b0 = pack2(xrow, k0 + 2 * q), b1 = pack2(xrow, k0 + 8 + 2 * q);
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};\n"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
    C1[g * V + nb * 8 + 2 * q] = c[0];
    C1[g * V + nb * 8 + 2 * q + 1] = c[1];
    C1[(g + 8) * V + nb * 8 + 2 * q] = c[2];
    C1[(g + 8) * V + nb * 8 + 2 * q + 1] = c[3];
  }
}

// Shared-memory image of a rows x 128 K-major bf16 matrix in wgmma's no-swizzle canonical form:
// 8x8 core matrices of 128 bytes (row r of a core at 16 r), core (row group, k group) at
// 128 * (16 * row_group + k_group). So the leading byte offset (next core along k) is 128 and
// the stride byte offset (next 8-row group) is 2048.
__device__ __forceinline__ int core_offset(int r, int k) {
  return ((r >> 3) * 16 + (k >> 3)) * 128 + (r & 7) * 16 + (k & 7) * 2;
}

__device__ __forceinline__ uint64_t desc(uint32_t smem_addr) {
  const uint64_t lbo = 128, sbo = 2048;
  return (uint64_t)((smem_addr >> 4) & 0x3FFF) | (((lbo >> 4) & 0x3FFF) << 16) |
         (((sbo >> 4) & 0x3FFF) << 32);  // base offset 0, layout type 0 (no swizzle)
}

// One warpgroup. C2[v][t] = sum_k X[v][k] Y[t][k] (m64n16, A = X, B = Y) and
// C3[t'][v] = sum_k Ypad[t'][k] X[v][k] (m64n64, A = Y padded to 64 rows, B = X), each as eight
// k16 steps, k ascending, the first with scale-d = 0.
__global__ void wgmma_chain(const __nv_bfloat16 *X, const __nv_bfloat16 *Y, float *C2, float *C3) {
  __shared__ __align__(1024) unsigned char sX[V * K * 2];
  __shared__ __align__(1024) unsigned char sY[64 * K * 2];
  int tid = threadIdx.x;
  for (int i = tid; i < V * K; i += blockDim.x) {
    int r = i / K, k = i % K;
    *reinterpret_cast<__nv_bfloat16 *>(sX + core_offset(r, k)) = X[i];
    // rows >= T of the padded Y repeat the tile (any values do: those rows of C3 are not compared)
    *reinterpret_cast<__nv_bfloat16 *>(sY + core_offset(r, k)) = Y[(r % T) * K + k];
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  uint32_t ax = (uint32_t)__cvta_generic_to_shared(sX), ay = (uint32_t)__cvta_generic_to_shared(sY);

  float d2[8], d3[32];
  for (int i = 0; i < 8; ++i) d2[i] = 0.f;
  for (int i = 0; i < 32; ++i) d3[i] = 0.f;
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  for (int ks = 0; ks < K / 16; ++ks) {
    uint32_t step = ks * 2 * 128;  // two k-groups of 8 per k16 step
    uint64_t da = desc(ax + step), db = desc(ay + step);
    int scale_d = ks > 0;
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d2[0]), "+f"(d2[1]), "+f"(d2[2]), "+f"(d2[3]), "+f"(d2[4]), "+f"(d2[5]), "+f"(d2[6]), "+f"(d2[7])
        : "l"(da), "l"(db), "r"(scale_d));
  }
  for (int ks = 0; ks < K / 16; ++ks) {
    uint32_t step = ks * 2 * 128;
    uint64_t da = desc(ay + step), db = desc(ax + step);
    int scale_d = ks > 0;
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d3[0]), "+f"(d3[1]), "+f"(d3[2]), "+f"(d3[3]), "+f"(d3[4]), "+f"(d3[5]), "+f"(d3[6]), "+f"(d3[7]),
          "+f"(d3[8]), "+f"(d3[9]), "+f"(d3[10]), "+f"(d3[11]), "+f"(d3[12]), "+f"(d3[13]), "+f"(d3[14]),
          "+f"(d3[15]), "+f"(d3[16]), "+f"(d3[17]), "+f"(d3[18]), "+f"(d3[19]), "+f"(d3[20]), "+f"(d3[21]),
          "+f"(d3[22]), "+f"(d3[23]), "+f"(d3[24]), "+f"(d3[25]), "+f"(d3[26]), "+f"(d3[27]), "+f"(d3[28]),
          "+f"(d3[29]), "+f"(d3[30]), "+f"(d3[31])
        : "l"(da), "l"(db), "r"(scale_d));
  }
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");

  // accumulator layout of m64nN: warp w holds rows 16w + g and 16w + g + 8; per 8-column block j,
  // d[4j..4j+3] = (row, 8j + 2q), (row, 8j + 2q + 1), (row + 8, 8j + 2q), (row + 8, 8j + 2q + 1)
  int w = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3, r0 = 16 * w + g;
  for (int j = 0; j < T / 8; ++j) {
    C2[r0 * T + 8 * j + 2 * q] = d2[4 * j];
    C2[r0 * T + 8 * j + 2 * q + 1] = d2[4 * j + 1];
    C2[(r0 + 8) * T + 8 * j + 2 * q] = d2[4 * j + 2];
    C2[(r0 + 8) * T + 8 * j + 2 * q + 1] = d2[4 * j + 3];
  }
  for (int j = 0; j < V / 8; ++j) {
    C3[r0 * V + 8 * j + 2 * q] = d3[4 * j];
    C3[r0 * V + 8 * j + 2 * q + 1] = d3[4 * j + 1];
    C3[(r0 + 8) * V + 8 * j + 2 * q] = d3[4 * j + 2];
    C3[(r0 + 8) * V + 8 * j + 2 * q + 1] = d3[4 * j + 3];
  }
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double uniform() {  // xorshift64*, in (0, 1)
  rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
  return ((rng_state * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0) + 1e-300;
}
static double normal() { return sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform()); }

// Input classes: N(0,1); a wide exponent range (x 2^[-20, 20]), which stresses the alignment of
// the products inside one k16 step; and sums that cancel (each k pair holds +x and -x + small).
static float draw(int mode, int k) {
  switch (mode) {
    case 0: return (float)normal();
    case 1: return (float)(normal() * ldexp(1.0, (int)(uniform() * 41) - 20));
    default: { double x = normal() * 64; return (float)((k & 1) ? -x + normal() * 1e-2 : x); }
  }
}

int main() {
  const char *names[3] = {"N(0,1)", "wide exponents", "cancelling pairs"};
  int worst = 0;
  for (int mode = 0; mode < 3; ++mode) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<__nv_bfloat16> hX(V * K), hY(T * K);
      for (int i = 0; i < V * K; ++i) hX[i] = __float2bfloat16(draw(mode, i % K));
      for (int i = 0; i < T * K; ++i) hY[i] = __float2bfloat16(draw(mode, i % K));
      __nv_bfloat16 *dX, *dY; float *dC1, *dC2, *dC3;
      CHECK(cudaMalloc(&dX, V * K * 2)); CHECK(cudaMalloc(&dY, T * K * 2));
      CHECK(cudaMalloc(&dC1, T * V * 4)); CHECK(cudaMalloc(&dC2, V * T * 4)); CHECK(cudaMalloc(&dC3, 64 * V * 4));
      CHECK(cudaMemcpy(dX, hX.data(), V * K * 2, cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(dY, hY.data(), T * K * 2, cudaMemcpyHostToDevice));
      CHECK(cudaMemset(dC1, 0xFF, T * V * 4)); CHECK(cudaMemset(dC2, 0xFF, V * T * 4));
      CHECK(cudaMemset(dC3, 0xFF, 64 * V * 4));  // poisoned: NaN where nothing was written
      mma_chain<<<1, 32>>>(dX, dY, dC1);
      wgmma_chain<<<1, 128>>>(dX, dY, dC2, dC3);
      CHECK(cudaGetLastError()); CHECK(cudaDeviceSynchronize());
      std::vector<float> C1(T * V), C2(V * T), C3(64 * V);
      CHECK(cudaMemcpy(C1.data(), dC1, T * V * 4, cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(C2.data(), dC2, V * T * 4, cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(C3.data(), dC3, 64 * V * 4, cudaMemcpyDeviceToHost));
      cudaFree(dX); cudaFree(dY); cudaFree(dC1); cudaFree(dC2); cudaFree(dC3);
      int diff_t = 0, diff_p = 0;
      double err1 = 0, err2 = 0, err3 = 0, scale = 0;
      for (int t = 0; t < T; ++t)
        for (int v = 0; v < V; ++v) {
          double ref = 0, mag = 0;
          for (int k = 0; k < K; ++k) {
            double p = (double)__bfloat162float(hY[t * K + k]) * (double)__bfloat162float(hX[v * K + k]);
            ref += p; mag += fabs(p);
          }
          scale = fmax(scale, mag);
          float c1 = C1[t * V + v], c2 = C2[v * T + t], c3 = C3[t * V + v];
          diff_t += memcmp(&c1, &c2, 4) != 0;
          diff_p += memcmp(&c1, &c3, 4) != 0;
          err1 = fmax(err1, fabs(c1 - ref)); err2 = fmax(err2, fabs(c2 - ref)); err3 = fmax(err3, fabs(c3 - ref));
        }
      bool wrong = !(err1 <= 1e-3 * scale && err2 <= 1e-3 * scale && err3 <= 1e-3 * scale);
      if (trial < 2 || diff_t || diff_p || wrong)
        printf("%-17s trial %2d: differ from mma.sync: transposed wgmma %4d / %d, padded wgmma %4d / %d; "
               "max |err| / sum|p|: mma %.2e, transposed %.2e, padded %.2e%s\n", names[mode], trial, diff_t,
               T * V, diff_p, T * V, err1 / scale, err2 / scale, err3 / scale, wrong ? "  WRONG" : "");
      if (wrong) worst = 2;
      else if ((diff_t || diff_p) && worst < 1) worst = 1;
    }
  }
  printf(worst == 0 ? "bitwise equal in every trial\n" : worst == 1 ? "rounding differs\n" : "a result is wrong\n");
  return worst;
}
