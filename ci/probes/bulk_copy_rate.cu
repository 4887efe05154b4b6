// How fast can one SM bring in 16-token tiles of row-strided bf16 rows (q, k, g and v of one
// head: 64 rows of 256 bytes, 16 KiB apart, per tile)? The fused K1-in-K2 prototype copies each
// row with its own cp.async.bulk; this probe times that against fewer issuing lanes, per-thread
// cp.async, and larger rows, with nothing else running on the SM (one CTA per SM, a ring of three
// slots, each slot waited on and refilled at once).
// Measured on the H200 (2026-12-01, docs/what_we_tried.md): 4058, 1751, 254 and 1716 ns per
// tile for the four modes below.
//   Output: ns per tile per SM for each mode. Exit status 1 on a CUDA error, 2 when the buffers
//   cannot be allocated.
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

constexpr int ROWS = 64;        // rows per tile (16 tokens x 4 tensors)
constexpr int ROW_BYTES = 256;  // one token row of one head, bf16 x 128
constexpr int SLOTS = 3;
constexpr int THREADS = 256;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* b, int count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* b, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes));
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared.b64 _, [%0];" ::"r"(smem_u32(b)));
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, int phase) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tWAIT_%=:\n\t"
      "mbarrier.try_wait.parity.shared.b64 p, [%0], %1;\n\t@!p bra WAIT_%=;\n\t}" ::"r"(smem_u32(b)),
      "r"(phase));
}
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, int bytes, uint64_t* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(b))
               : "memory");
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_arrive(uint64_t* b) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];" ::"r"(smem_u32(b)));
}

// mode 0: one lane issues all row copies; mode 1: one lane per warp, rows split over 8 warps;
// mode 2: per-thread 16-byte cp.async; mode 3: one lane, 16 copies of 4 x ROW_BYTES contiguous
// bytes (a quarter of the copies, the same bytes: does the engine charge per copy or per byte?).
template <int MODE>
__global__ void __launch_bounds__(THREADS, 1) probe(const uint8_t* src, long row_stride, int tiles, long tile_stride,
                                                    unsigned* sums) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem);
  uint8_t* buf = smem + 128;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const uint8_t* base = src + blockIdx.x * (long)ROW_BYTES * 4;
  if (tid == 0) {
    for (int s = 0; s < SLOTS; ++s) mbar_init(&bars[s], MODE == 2 ? THREADS : (MODE == 1 ? 8 : 1));
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  auto issue = [&](int t) {
    int s = t % SLOTS;
    uint8_t* dst = buf + s * ROWS * ROW_BYTES;
    const uint8_t* tsrc = base + (long)t * tile_stride;
    if (MODE == 0 || MODE == 3) {
      if (tid == 0) {
        mbar_expect_tx(&bars[s], ROWS * ROW_BYTES);
        int per = MODE == 3 ? 4 : 1;
        for (int r = 0; r < ROWS / per; ++r)
          bulk_g2s(dst + r * per * ROW_BYTES, tsrc + r * row_stride, per * ROW_BYTES, &bars[s]);
      }
    } else if (MODE == 1) {
      if (lane == 0) {
        mbar_expect_tx(&bars[s], ROWS / 8 * ROW_BYTES);
        for (int r = warp; r < ROWS; r += 8)
          bulk_g2s(dst + r * ROW_BYTES, tsrc + r * row_stride, ROW_BYTES, &bars[s]);
      }
    } else {
      for (int c = tid; c < ROWS * ROW_BYTES / 16; c += THREADS) {
        int r = c / (ROW_BYTES / 16), col = c % (ROW_BYTES / 16);
        cp_async16(dst + r * ROW_BYTES + col * 16, tsrc + r * row_stride + col * 16);
      }
      cp_async_arrive(&bars[s]);
    }
  };
  for (int t = 0; t < SLOTS && t < tiles; ++t) issue(t);
  unsigned acc = 0;
  for (int t = 0; t < tiles; ++t) {
    int s = t % SLOTS;
    mbar_wait(&bars[s], (t / SLOTS) & 1);
    acc += reinterpret_cast<const unsigned*>(buf + s * ROWS * ROW_BYTES)[tid];
    __syncthreads();  // everyone read slot s before it is refilled
    if (t + SLOTS < tiles) issue(t + SLOTS);
  }
  if (tid == 0) sums[blockIdx.x] = acc;
}

template <int MODE>
float run(const uint8_t* src, long row_stride, int tiles, long tile_stride, unsigned* sums, int sms) {
  size_t smem = 128 + SLOTS * ROWS * ROW_BYTES;
  cudaFuncSetAttribute(probe<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  probe<MODE><<<sms, THREADS, smem>>>(src, row_stride, tiles, tile_stride, sums);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  probe<MODE><<<sms, THREADS, smem>>>(src, row_stride, tiles, tile_stride, sums);
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms;
  cudaEventElapsedTime(&ms, a, b);
  return ms;
}

int main() {
  int sms;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int tiles = 2048;
  // Like q of H=64: token rows 64 x 256 B apart; 4 tensors' rows side by side per CTA.
  const long row_stride = 64L * ROW_BYTES;
  // Tile t starts 4 token rows after tile t - 1 (its windows overlap): the footprint stays at
  // about 130 MiB while every tile still reads 64 rows 16 KiB apart. The engine's cost per copy is
  // what is measured, not DRAM.
  const long tile_stride = 4L * row_stride;
  const long span = tile_stride * (long)tiles;
  uint8_t* src;
  unsigned* sums;
  if (cudaMalloc(&src, span + row_stride * ROWS + (long)sms * ROW_BYTES * 4) != cudaSuccess) return 2;
  cudaMemset(src, 1, span + row_stride * ROWS + (long)sms * ROW_BYTES * 4);
  cudaMalloc(&sums, sms * sizeof(unsigned));
  const char* names[] = {"one lane, 64 row copies of 256 B", "8 warps x 8 row copies of 256 B",
                         "256 threads x 4 cp.async of 16 B", "one lane, 16 copies of 1 KiB"};
  float ms[4];
  ms[0] = run<0>(src, row_stride, tiles, tile_stride, sums, sms);
  ms[1] = run<1>(src, row_stride, tiles, tile_stride, sums, sms);
  ms[2] = run<2>(src, row_stride, tiles, tile_stride, sums, sms);
  ms[3] = run<3>(src, row_stride, tiles, tile_stride, sums, sms);
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    printf("CUDA error %s\n", cudaGetErrorString(e));
    return 1;
  }
  printf("%d CTAs (one per SM), %d tiles of %d rows each, 16 KiB per tile\n", sms, tiles, ROWS);
  for (int m = 0; m < 4; ++m)
    printf("  %-36s %8.1f ns per tile per SM  (%.2f TB/s)\n", names[m], ms[m] * 1e6 / tiles,
           (double)sms * tiles * ROWS * ROW_BYTES / (ms[m] * 1e-3) / 1e12);
  return 0;
}
