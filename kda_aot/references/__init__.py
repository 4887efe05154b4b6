"""CPU references beside the torch one (kda_aot/reference.py, public): the NumPy reference, which
needs no torch, and the input classes the benchmarks and numerics tables run on."""
