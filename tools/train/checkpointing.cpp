#include "checkpointing.hpp"

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace tutti::train {

namespace {

// The settings that decide which samples each step sees: a run resumed with others would not
// continue the same training.
tutti::libtorch::CheckpointMetadata data_settings(const Settings& s) {
  return {{"batch_size", std::to_string(s.batch_size)},
          {"seed", std::to_string(s.seed)},
          {"backward_passes", std::to_string(s.backward_passes)},
          {"train_samples", std::to_string(s.train_samples)}};
}

std::int64_t integer(const tutti::libtorch::CheckpointMetadata& m, const std::string& key, const std::string& dir) {
  const auto it = m.find(key);
  try {
    if (it != m.end()) return std::stoll(it->second);
  } catch (const std::exception&) {
  }
  throw std::runtime_error("checkpoint " + dir + " has no valid '" + key + "' (not written by tutti-train?)");
}

}  // namespace

ResumePoint Checkpointing::resume(Communicator& comm) {
  if (s_.resume.empty()) return {};
  // Chosen by rank 0 for all (a checkpoint published meanwhile must not split the ranks); a
  // directory that does not exist is an error on every rank, not a fresh start.
  const auto latest = tutti::libtorch::latest_checkpoint(comm, s_.resume);
  if (!latest) {
    if (comm.rank() == 0)
      std::printf("tutti-train: no complete checkpoint in %s: starting from the beginning\n", s_.resume.c_str());
    return {};
  }
  const auto metadata = optimizer_.load_checkpoint(*latest);
  for (const auto& [key, value] : data_settings(s_)) {
    const auto it = metadata.find(key);
    if (it == metadata.end() || it->second != value)
      throw std::runtime_error("checkpoint " + *latest + " was taken with " + key + " " +
                               (it == metadata.end() ? "unknown" : it->second) + ", this run has " + value);
  }
  ResumePoint point{static_cast<int>(integer(metadata, "epoch", *latest)), integer(metadata, "step", *latest)};
  if (point.epoch < 1 || point.step < 0 || point.step >= steps_per_epoch_)
    throw std::runtime_error("checkpoint " + *latest + " is at epoch " + std::to_string(point.epoch) + " step " +
                             std::to_string(point.step) + ", outside this run's epochs");
  if (comm.rank() == 0)
    std::printf("tutti-train: resumed from %s (epoch %d, step %lld, optimizer step %llu)\n", latest->c_str(),
                point.epoch, static_cast<long long>(point.step),
                static_cast<unsigned long long>(optimizer_.optimizer_steps()));
  return point;
}

void Checkpointing::after_step(int epoch, std::int64_t step) {
  if (s_.checkpoint_dir.empty() || (step + 1) % s_.backward_passes != 0) return;  // not a step boundary
  const std::uint64_t steps = optimizer_.optimizer_steps();
  if (steps % static_cast<std::uint64_t>(s_.checkpoint_every) != 0) return;
  // Where training goes on from this checkpoint.
  const bool epoch_done = step + 1 == steps_per_epoch_;
  auto metadata = data_settings(s_);
  metadata["epoch"] = std::to_string(epoch_done ? epoch + 1 : epoch);
  metadata["step"] = std::to_string(epoch_done ? 0 : step + 1);
  char name[32];
  std::snprintf(name, sizeof name, "/step-%08llu", static_cast<unsigned long long>(steps));
  const auto start = std::chrono::steady_clock::now();
  if (s_.checkpoint_blocking)
    optimizer_.checkpoint(s_.checkpoint_dir + name, std::move(metadata));
  else
    optimizer_.checkpoint_async(s_.checkpoint_dir + name, std::move(metadata));
  call_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++taken_;
}

}  // namespace tutti::train
