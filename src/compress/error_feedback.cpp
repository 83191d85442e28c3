#include <string>

#include "tutti/compress.hpp"

namespace tutti::compress {

std::vector<float>& ErrorFeedback::slot(std::string_view name, std::size_t count) {
  auto [it, fresh] = residuals_.try_emplace(std::string(name));
  if (fresh) it->second.assign(count, 0.0f);
  if (it->second.size() != count)
    throw Error(ErrorCode::invalid_argument, "error feedback: tensor '" + std::string(name) + "' has " +
                                                 std::to_string(count) + " elements, earlier " +
                                                 std::to_string(it->second.size()));
  return it->second;
}

void ErrorFeedback::add_residual(std::string_view name, float* grad, std::size_t count) {
  if (count > 0 && grad == nullptr)
    throw Error(ErrorCode::invalid_argument, "error feedback: null gradient for '" + std::string(name) + "'");
  const auto& r = slot(name, count);
  for (std::size_t i = 0; i < count; ++i) grad[i] += r[i];
}

void ErrorFeedback::set_residual(std::string_view name, const float* corrected, const float* sent, std::size_t count) {
  if (count > 0 && (corrected == nullptr || sent == nullptr))
    throw Error(ErrorCode::invalid_argument, "error feedback: null buffer for '" + std::string(name) + "'");
  auto& r = slot(name, count);
  for (std::size_t i = 0; i < count; ++i) r[i] = corrected[i] - sent[i];
}

std::span<const float> ErrorFeedback::residual(std::string_view name) const {
  const auto it = residuals_.find(std::string(name));
  if (it == residuals_.end()) return {};
  return it->second;
}

}  // namespace tutti::compress
