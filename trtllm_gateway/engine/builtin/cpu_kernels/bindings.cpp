// The Python module that cpu_kernels/build.py compiles: block matmuls (float32 and int8
// activations), decode attention, RMSNorm, RoPE with the KV store, SiLU-and-multiply.
#include <torch/extension.h>

#include "block_gemm.h"
#include "decode_attention.h"
#include "fused_ops.h"
#include "q8_gemm.h"
#include "rms_norm.h"
#include "simd.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("q4_1_mm", &trtllm_gateway::q4_1_mm, "x @ W^T, W in Q4_1 blocks");
  m.def("q8_0_mm", &trtllm_gateway::q8_0_mm, "x @ W^T, W in Q8_0 blocks");
  m.def("q8_native", &trtllm_gateway::q8_native, "int8 dot products in AVX512-VNNI");
  m.def("quantize_q8", &trtllm_gateway::quantize_q8, "float32 rows to int8 32-value blocks");
  m.def("q8_mm", &trtllm_gateway::q8_mm, "int8 rows @ W^T, W in Q4_1 / Q8_0 groups of 16 columns");
  m.def("rope_store", &trtllm_gateway::rope_store, "RoPE of Q and K, K and V into the cache");
  m.def("silu_mul", &trtllm_gateway::silu_mul, "silu(gate) * up of a [T, 2I] gate_up row");
  m.def("rms_norm", &trtllm_gateway::rms_norm, "RMSNorm of float32 rows");
  m.def("decode_attention", &trtllm_gateway::decode_attention, "paged decode attention, float32");
}
