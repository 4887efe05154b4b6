"""What the kernels share: each module here is traced by every kernel that imports it, so two kernels
that must compute something alike (K2 and pre_scan's step, the stage ring, the rounding PTX) import
it from here, and no kernel module imports another (tests/build/test_kernel_imports.py)."""
