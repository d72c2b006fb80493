// x @ W^T with activations quantized to int8 per 32-value block (llama.cpp's Q8_1 scheme) and
// integer dot products against GGUF's Q4_1 / Q8_0 weight blocks: q8_gemm.cpp.
#pragma once

#include <torch/extension.h>

#include <string>
#include <tuple>

namespace trtllm_gateway {
bool q8_native();
std::string q8_path();  // "avx512-vnni", "avx-vnni", "avx2" or "portable"
std::tuple<torch::Tensor, torch::Tensor> quantize_q8(const torch::Tensor& x);
torch::Tensor q8_mm(const torch::Tensor& qx, const torch::Tensor& xs, const torch::Tensor& w,
                    const torch::Tensor& sc, bool nibbles, bool portable);
}  // namespace trtllm_gateway
