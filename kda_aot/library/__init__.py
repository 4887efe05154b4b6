"""The compiled kernel library and the device: finding and loading libkda_kernels.so, checking its
manifest against the kernel ABI this package expects, and the driver's streams and device facts."""
