// A fixed-size array that lives inside its owner when small: the per-call state of a small
// collective (a schedule run's arrays, a direct run's block starts) without an allocation.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <type_traits>

namespace tutti::core {

/// `n` value-initialised elements of T, placed once (place(n), on a fresh object): inside the
/// object when n <= N, else on the heap. Never moves (its elements' addresses are handed out).
template <class T, std::size_t N>
class InlineArray {
 public:
  InlineArray() = default;
  InlineArray(const InlineArray&) = delete;
  InlineArray& operator=(const InlineArray&) = delete;
  void place(std::size_t n) {
    heap_ = n <= N ? nullptr : std::make_unique<T[]>(n);
    data_ = heap_ ? heap_.get() : inline_.data();
    // Only the n placed, and only where T's constructor leaves them unset: an owner is made on
    // every call.
    if constexpr (std::is_trivially_default_constructible_v<T>)
      if (!heap_) std::fill_n(data_, n, T{});
    size_ = n;
  }
  T* data() const { return data_; }
  T& operator[](std::size_t i) const { return data_[i]; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& back() const { return data_[size_ - 1]; }
  operator std::span<const T>() const { return {data_, size_}; }  // NOLINT(google-explicit-constructor)

 private:
  std::array<T, N> inline_;  // NOLINT(cppcoreguidelines-pro-type-member-init): see place
  std::unique_ptr<T[]> heap_;
  T* data_ = inline_.data();
  std::size_t size_ = 0;
};

}  // namespace tutti::core
