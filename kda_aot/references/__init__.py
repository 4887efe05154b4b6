"""CPU references: the float64 gold and the chunked algorithm with emulated roundings (torch), a numpy
reference, and the input classes the benchmarks and numerics tables run on."""
