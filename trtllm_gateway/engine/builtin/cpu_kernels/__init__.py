"""C++ kernels of the CPU path, compiled on first use with the system compiler (build.py).

block_gemm.cpp multiplies float32 activations by weights kept in GGUF's 32-weight blocks; the
engine uses it for decode-sized steps when the weights are exactly such blocks (packed_linear.py).
"""
