"""The runtime's own error types, in a module of their own so that every module can raise them without
importing the library loader (identity.py checks a library that loader.py opens)."""


class KdaError(RuntimeError):
    """Base class of the runtime's own errors."""


class LibraryNotFoundError(KdaError):
    pass


class KernelNotBuiltError(KdaError):
    """A kernel the call asks for is a variant of this package that the loaded library does not hold
    (a measurement-only kernel, outside the shipped lattice: build_kernels/registry.py)."""


# cudaErrorInsufficientDriver: what the runtime answers without a usable driver.
CUDA_ERROR_INSUFFICIENT_DRIVER = 35


class CudaError(KdaError):
    """A CUDA call inside the library failed; carries the kernel name and the CUDA error."""

    def __init__(self, what: str, code: int, name: str, message: str):
        super().__init__(f"{what}: CUDA error {code} ({name}): {message}")
        self.code = code
        self.cuda_name = name
