// The tensor API the kernels use, without <torch/extension.h>: that header (pybind11 and the whole
// C++ frontend) took ~35 s to parse per translation unit on a 2-core CI machine, these ~3 s; only
// bindings.cpp, which converts Python objects, includes torch's Python casters (<torch/python.h>).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
