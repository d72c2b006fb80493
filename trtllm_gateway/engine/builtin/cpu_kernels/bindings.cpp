// The Python module that cpu_kernels/build.py compiles: block matmuls (float32 and int8
// activations), decode attention, RMSNorm, RoPE with the KV store, SiLU-and-multiply, and a pure
// decode step's whole decoder stack (DecodeStack).
#include <torch/python.h>  // the Tensor casters (<torch/extension.h> adds the C++ frontend)

#include "block_gemm.h"
#include "decode_attention.h"
#include "decode_stack.h"
#include "fused_ops.h"
#include "q8_gemm.h"
#include "rms_norm.h"
#include "simd.h"

#include <string>

namespace {
std::string simd_path() {
#if defined(GW_AVX512)
  return "avx512";
#elif defined(GW_AVX2)
  return "avx2";
#else
  return "portable";
#endif
}
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("q4_1_mm", &trtllm_gateway::q4_1_mm, "x @ W^T, W in Q4_1 blocks");
  m.def("q8_0_mm", &trtllm_gateway::q8_0_mm, "x @ W^T, W in Q8_0 blocks");
  m.def("simd_path", &simd_path, "the float kernels' vectors: avx512, avx2 or portable");
  m.def("q8_path", &trtllm_gateway::q8_path, "the int8 dot products: avx512-vnni, avx-vnni, avx2, portable");
  m.def("q8_native", &trtllm_gateway::q8_native, "int8 dot products in SIMD, not the portable loop");
  m.def("quantize_q8", &trtllm_gateway::quantize_q8, "float32 rows to int8 32-value blocks");
  m.def("q8_mm", &trtllm_gateway::q8_mm, "int8 rows @ W^T, W in Q4_1 / Q8_0 groups of 16 columns");
  m.def("rope_store", &trtllm_gateway::rope_store, "RoPE of Q and K, K and V into the cache");
  m.def("silu_mul", &trtllm_gateway::silu_mul, "silu(gate) * up of a [T, 2I] gate_up row");
  m.def("rms_norm", &trtllm_gateway::rms_norm, "RMSNorm of float32 rows");
  m.def("decode_attention", &trtllm_gateway::decode_attention, "paged decode attention, float32");
  // module_local: every ISA variant is its own module with this same C++ type, and a process
  // that loads two (the tests load native and portable) must not register it twice.
  pybind11::class_<trtllm_gateway::DecodeStack>(m, "DecodeStack", pybind11::module_local(),
                                                "a pure decode step's decoder stack, one call")
      .def(pybind11::init<std::vector<torch::Tensor>, torch::Tensor, std::vector<torch::Tensor>,
                          std::vector<torch::Tensor>, std::vector<bool>,
                          std::vector<torch::Tensor>, int64_t, int64_t, double, double, int64_t,
                          int64_t>())
      .def("forward", &trtllm_gateway::DecodeStack::forward,
           pybind11::call_guard<pybind11::gil_scoped_release>());
}
