// tutti-train's network and input normalization.
#pragma once

#include <torch/torch.h>

namespace tutti::train {

/// Conv(1→16w, 3x3, pad 1) → ReLU → MaxPool 2 → Conv(16w→32w, 3x3, pad 1) → ReLU → MaxPool 2 →
/// flatten (32w·7·7) → Linear(→128w) → ReLU → Linear(128w→10), w = `width` (1: 1568 → 128 → 10).
/// Returns logits. The network is four units (forward_unit), the pieces pipeline stages take.
struct NetImpl : torch::nn::Module {
  static constexpr int units = 4;

  explicit NetImpl(int width = 1)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16 * width, 3).padding(1)))),
        conv2(register_module("conv2",
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(16 * width, 32 * width, 3).padding(1)))),
        fc1(register_module("fc1", torch::nn::Linear(32 * width * 7 * 7, 128 * width))),
        fc2(register_module("fc2", torch::nn::Linear(128 * width, 10))) {}

  /// x: [N, 1, 28, 28], normalized (see normalize_images).
  torch::Tensor forward(torch::Tensor x) {
    for (int unit = 0; unit < units; ++unit) x = forward_unit(unit, x);
    return x;
  }

  /// Unit 0: conv1, ReLU, pool; 1: conv2, ReLU, pool, flatten; 2: fc1, ReLU; 3: fc2.
  torch::Tensor forward_unit(int unit, const torch::Tensor& x) {
    switch (unit) {
      case 0:
        return torch::max_pool2d(torch::relu(conv1->forward(x)), 2);
      case 1:
        return torch::max_pool2d(torch::relu(conv2->forward(x)), 2).flatten(1);
      case 2:
        return torch::relu(fc1->forward(x));
      default:
        return fc2->forward(x);
    }
  }

  torch::nn::Conv2d conv1;
  torch::nn::Conv2d conv2;
  torch::nn::Linear fc1;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Net);

/// Fashion-MNIST's pixel statistics (of x/255 over the training set).
inline constexpr double pixel_mean = 0.2860;
inline constexpr double pixel_std = 0.3530;

/// Bytes [N, 28, 28] (0..255) → float [N, 1, 28, 28], (x/255 − mean) / std.
inline torch::Tensor normalize_images(const torch::Tensor& bytes) {
  return ((bytes.to(torch::kFloat32) / 255.0 - pixel_mean) / pixel_std).unsqueeze(1).contiguous();
}

/// The training loss: cross entropy of the logits (mean over the batch, or `reduction`).
inline torch::Tensor loss_of(const torch::Tensor& logits, const torch::Tensor& labels,
                             torch::nn::functional::CrossEntropyFuncOptions::reduction_t reduction = torch::kMean) {
  return torch::nn::functional::cross_entropy(logits, labels,
                                              torch::nn::functional::CrossEntropyFuncOptions().reduction(reduction));
}

}  // namespace tutti::train
