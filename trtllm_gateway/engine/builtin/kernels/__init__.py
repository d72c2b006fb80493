"""Triton kernels of the CUDA path: paged attention, RoPE + KV store, norms, sampling.

Each module imports triton at import time; import them only when CUDA is in use (the CPU path never
does). Kernels read the KV cache in place through the block table: slot = block * page + offset.
"""
