"""The caller's side of a call: reading DLPack / torch / CuPy / JAX tensors and streams into
descriptions, the validation wall over them, handing outputs back, and the releases that wait for
the device."""
