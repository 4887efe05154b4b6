/* The eight runtime entry points that every object exported by CuTe DSL calls, written here as
 * plain forwards to the CUDA runtime (linked statically) and, for the one driver call, to the
 * driver entry point the runtime hands out. NVIDIA ships the same forwards in an archive whose
 * licence forbids redistribution, so the wheel carries these instead. */
#include "cuda_abi.h"

#define KDA_HIDDEN __attribute__((visibility("hidden")))

KDA_HIDDEN cudaError_t _cudaGetDevice(int *device) { return cudaGetDevice(device); }

KDA_HIDDEN cudaError_t _cudaDeviceGetAttribute(int *value, int attr, int device) {
  return cudaDeviceGetAttribute(value, attr, device);
}

KDA_HIDDEN cudaError_t _cudaFuncSetAttribute(const void *func, int attr, int value) {
  return cudaFuncSetAttribute(func, attr, value);
}

KDA_HIDDEN cudaError_t _cudaKernelSetAttributeForDevice(cudaKernel_t kernel, int attr,
                                                        int value, int device) {
  return cudaKernelSetAttributeForDevice(kernel, attr, value, device);
}

KDA_HIDDEN cudaError_t _cudaLaunchKernelEx(const cudaLaunchConfig_t *config, const void *func, void **args) {
  return cudaLaunchKernelExC(config, func, args);
}

KDA_HIDDEN cudaError_t _cudaLibraryGetKernel(cudaKernel_t *kernel, cudaLibrary_t library, const char *name) {
  return cudaLibraryGetKernel(kernel, library, name);
}

KDA_HIDDEN cudaError_t _cudaLibraryLoadData(cudaLibrary_t *library, const void *code, int *jit_options,
                                            void **jit_values, unsigned int n_jit, int *lib_options,
                                            void **lib_values, unsigned int n_lib) {
  return cudaLibraryLoadData(library, code, jit_options, jit_values, n_jit, lib_options, lib_values, n_lib);
}

/* The driver function is looked up once through the runtime, so the library never links libcuda. */
typedef CUresult (*kda_cuKernelGetAttribute_t)(int *, int, CUkernel, CUdevice);

KDA_HIDDEN CUresult _cuKernelGetAttribute(int *value, int attr, CUkernel kernel, CUdevice device) {
  static kda_cuKernelGetAttribute_t fn = 0;
  if (!fn) {
    int found = -1;
    void *p = 0;
    if (cudaGetDriverEntryPointByVersion("cuKernelGetAttribute", &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess || !p)
      return CUDA_ERROR_NOT_FOUND;
    fn = (kda_cuKernelGetAttribute_t)p;
  }
  return fn(value, attr, kernel, device);
}
