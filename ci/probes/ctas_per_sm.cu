// How many 288-thread (9-warp) CTAs share an SM at a given register count? (docs/k2_producer.md)
//
// K2 with a producer warp has 9 warps. By the SM's 65536 registers, two such CTAs fit at up to
// 112 registers per thread; if registers are allocated per sub-partition (four of 16384, a CTA's
// warps dealt round-robin over them, so two CTAs put 5 warps on two sub-partitions), only at 96 or
// fewer. This probe compiles one register-hungry kernel at caps of 96..128 registers, asks the
// occupancy API, and launches two CTAs per SM that record their SM and start / end times: CTAs on
// the same SM either overlap in time (two resident) or do not (one).
//
//   nvcc -gencode arch=compute_90a,code=sm_90a -O2 -o ctas_per_sm ci/probes/ctas_per_sm.cu && ./ctas_per_sm
//
// Measurement tool only: nothing in the library uses it. Spills in the probe are expected (each
// thread keeps more values live than any cap); only the register count decides residency.
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); return 3; } } while (0)
constexpr int LIVE = 124;  // values each thread keeps live: more registers than any cap below

__device__ __forceinline__ uint64_t gtimer() { uint64_t t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ uint32_t smid() { uint32_t s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s)); return s; }

template <int R> __global__ void __maxnreg__(R) busy(float *sink, uint64_t *t0, uint64_t *t1, uint32_t *sm, int iters) {
  float a[LIVE];
#pragma unroll
  for (int i = 0; i < LIVE; ++i) a[i] = threadIdx.x * 0.001f + i;
  __syncthreads();
  uint64_t start = gtimer();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < LIVE; ++i) a[i] = a[i] * 0.999f + a[(i + 1) % LIVE] * 0.001f;
  }
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < LIVE; ++i) s += a[i];
  if (s == 12345.f) sink[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) { t0[blockIdx.x] = start; t1[blockIdx.x] = gtimer(); sm[blockIdx.x] = smid(); }
}

template <int R> int run(int nsm) {
  int occ = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, busy<R>, 288, 0));
  cudaFuncAttributes fa; CHECK(cudaFuncGetAttributes(&fa, busy<R>));
  int nb = 2 * nsm;
  float *sink; uint64_t *t0, *t1; uint32_t *sm;
  CHECK(cudaMalloc(&sink, 4096)); CHECK(cudaMalloc(&t0, 8 * nb)); CHECK(cudaMalloc(&t1, 8 * nb)); CHECK(cudaMalloc(&sm, 4 * nb));
  busy<R><<<nb, 288>>>(sink, t0, t1, sm, 200); CHECK(cudaDeviceSynchronize());
  busy<R><<<nb, 288>>>(sink, t0, t1, sm, 20000); CHECK(cudaDeviceSynchronize());
  std::vector<uint64_t> a(nb), b(nb); std::vector<uint32_t> s(nb);
  CHECK(cudaMemcpy(a.data(), t0, 8 * nb, cudaMemcpyDeviceToHost)); CHECK(cudaMemcpy(b.data(), t1, 8 * nb, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(s.data(), sm, 4 * nb, cudaMemcpyDeviceToHost));
  // CTAs that overlap in time on the same SM
  int overlapping_pairs = 0, same_sm_pairs = 0;
  for (int i = 0; i < nb; ++i) for (int j = i + 1; j < nb; ++j) if (s[i] == s[j]) {
    ++same_sm_pairs; if (a[i] < b[j] && a[j] < b[i]) ++overlapping_pairs; }
  uint64_t lo = *std::min_element(a.begin(), a.end()), hi = *std::max_element(b.begin(), b.end());
  printf("cap %3d: ptxas registers %3d, spill(local) %zu B, occupancy API %d CTA/SM; %d CTAs: same-SM pairs %d, overlapping %d, span %.1f us\n",
         R, fa.numRegs, fa.localSizeBytes, occ, nb, same_sm_pairs, overlapping_pairs, (hi - lo) / 1e3);
  cudaFree(sink); cudaFree(t0); cudaFree(t1); cudaFree(sm);
  return 0;
}
int main() {
  int nsm; cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0);
  return run<96>(nsm) | run<104>(nsm) | run<112>(nsm) | run<120>(nsm) | run<128>(nsm);
}
