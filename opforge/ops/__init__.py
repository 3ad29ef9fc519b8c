"""Python wrappers, fake kernels and autograd for every op (one module per op)."""
