/* The handful of CUDA runtime declarations the shim needs, written out so the build needs no CUDA
 * toolkit headers (the runtime wheel's headers require the compiler's crt/ directory). Every type
 * here is passed through untouched: enums are C ints and handles are opaque pointers, which is
 * exactly how the CUDA runtime API declares them. Signatures follow the CUDA 12 runtime API. */
#pragma once
#include <stdint.h>

typedef int cudaError_t;      /* enum cudaError */
typedef int CUresult;         /* enum cudaError_enum */
typedef int CUdevice;
typedef struct CUlib_st *cudaLibrary_t;
typedef struct CUkern_st *cudaKernel_t;
typedef struct CUkern_st *CUkernel;
typedef struct cudaLaunchConfig_st cudaLaunchConfig_t;

#define cudaSuccess 0
#define cudaErrorInvalidValue 1
#define CUDA_ERROR_NOT_FOUND 500
#define cudaEnableDefault 0ULL
#define cudaDriverEntryPointSuccess 0
#define KDA_ATTR_PREFERRED_CARVEOUT 9 /* cudaFuncAttributePreferredSharedMemoryCarveout */
#define KDA_CARVEOUT_MAX_SHARED 100   /* cudaSharedmemCarveoutMaxShared: percent of the maximum */

cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceGetAttribute(int *value, int attr, int device);
cudaError_t cudaFuncSetAttribute(const void *func, int attr, int value);
cudaError_t cudaKernelSetAttributeForDevice(cudaKernel_t kernel, int attr, int value, int device);
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args);
cudaError_t cudaLibraryGetKernel(cudaKernel_t *kernel, cudaLibrary_t library, const char *name);
cudaError_t cudaLibraryGetKernelCount(unsigned int *count, cudaLibrary_t library);
cudaError_t cudaLibraryEnumerateKernels(cudaKernel_t *kernels, unsigned int count, cudaLibrary_t library);
cudaError_t cudaLibraryLoadData(cudaLibrary_t *library, const void *code, int *jit_options, void **jit_values,
                                unsigned int n_jit, int *lib_options, void **lib_values, unsigned int n_lib);
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int cuda_version,
                                             unsigned long long flags, int *status);
const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);
