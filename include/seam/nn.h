// Layers: builder functions that create their parameters (named "<name>.weight",
// "<name>.bias", ...) with PyTorch's default initialization, then add the op.
#pragma once
#include <string>

#include "seam/ops.h"

namespace seam::nn {

Var linear(Var x, int64_t out_features, const std::string& name, bool bias = true);
// A linear layer on another layer's weight [out, in] (an embedding's, for a language
// model's output projection): one parameter, whose gradient sums both uses. Its own bias,
// if any, is "<name>.bias".
Var linear_tied(Var x, Var weight, const std::string& name, bool bias = true);
Var conv2d(Var x, int64_t out_channels, int64_t kernel, const std::string& name,
           const Conv2dOptions& options = {}, bool bias = true);
// gamma = 1, beta = 0, running mean 0 and variance 1; gamma and beta get no weight decay.
Var batch_norm(Var x, const std::string& name, double momentum = 0.1, double eps = 1e-5);
Var layer_norm(Var x, const std::string& name, double eps = 1e-5);
// weight ~ N(0, 1), as torch.nn.Embedding.
Var embedding(Var ids, int64_t num, int64_t dim, const std::string& name);

}  // namespace seam::nn
