// The Python module that cpu_kernels/build.py compiles: block matmuls, decode attention, RMSNorm.
#include <torch/extension.h>

#include "block_gemm.h"
#include "decode_attention.h"
#include "rms_norm.h"
#include "simd.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("q4_1_mm", &trtllm_gateway::q4_1_mm, "x @ W^T, W in Q4_1 blocks");
  m.def("q8_0_mm", &trtllm_gateway::q8_0_mm, "x @ W^T, W in Q8_0 blocks");
  m.def("rms_norm", &trtllm_gateway::rms_norm, "RMSNorm of float32 rows");
  m.def("decode_attention", &trtllm_gateway::decode_attention, "paged decode attention, float32");
}
