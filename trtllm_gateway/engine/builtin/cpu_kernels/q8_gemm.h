// x @ W^T with activations quantized to int8 per 32-value block (llama.cpp's Q8_1 scheme) and
// integer dot products against GGUF's Q4_1 / Q8_0 weight blocks: q8_gemm.cpp.
#pragma once

#include "tensor.h"

#include <string>
#include <tuple>

namespace trtllm_gateway {
bool q8_native();
std::string q8_path();  // "avx512-vnni", "avx-vnni", "avx2" or "portable"
std::tuple<at::Tensor, at::Tensor> quantize_q8(const at::Tensor& x);
at::Tensor q8_mm(const at::Tensor& qx, const at::Tensor& xs, const at::Tensor& w,
                    const at::Tensor& sc, bool nibbles, bool portable);
}  // namespace trtllm_gateway
