"""The references' algorithm and what runs it: chunked.py (the float64 gold and the chunked
algorithm, docs/algorithm.md §2) over rounding.py's hooks, written once for two array backends
(backend_torch.py, backend_numpy.py); reference_np.py runs it on NumPy without torch (the torch
one, kda_aot/reference.py, is public); and the input classes the benchmarks and numerics tables
run on."""
