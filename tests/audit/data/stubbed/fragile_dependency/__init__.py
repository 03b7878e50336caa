"""A dependency that is installed but whose import fails here, like a CUDA kernel package on a CPU machine."""

raise OSError("libcudart.so.12: cannot open shared object file")
