// Checkpoints: restoring (checkpoint.hpp) and finding the latest (include/tutti/torch_checkpoint.hpp).
#include <torch/optim/optimizer.h>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "libtorch/broadcast.hpp"
#include "libtorch/checkpoint.hpp"
#include "libtorch/checkpoint_bytes.hpp"
#include "libtorch/checkpoint_files.hpp"
#include "tutti/torch_checkpoint.hpp"

namespace tutti::libtorch {

namespace detail {

CheckpointJob snapshot_checkpoint(int rank, int world, const std::string& dir, const NamedTensors& params,
                                  torch::optim::Optimizer& optimizer, const CheckpointMetadata& metadata,
                                  const CheckpointExtras& extras) {
  const std::string where = "tutti::libtorch checkpoint " + dir + " (rank " + std::to_string(rank) + "): ";
  auto plain = [](const std::string& s) { return !s.empty() && s.find_first_of(" \t\r\n\v\f") == std::string::npos; };
  CheckpointJob job{dir, {}, {}};
  job.manifest.world_size = world;
  job.manifest.optimizer = optimizer_type(optimizer);
  for (const auto& [key, value] : metadata) {
    if (!plain(key) || !plain(value))
      throw Error(ErrorCode::invalid_argument, where + "metadata '" + key + "' = '" + value +
                                                   "': keys and values must be non-empty, without whitespace");
    job.manifest.metadata[key] = value;
  }
  for (const auto& [name, t] : params) {
    if (!plain(name)) throw Error(ErrorCode::invalid_argument, where + "parameter name '" + name + "' has whitespace");
    job.manifest.params.emplace_back(name, shape_of(t));
  }
  if (name_exists(dir + "/" + manifest_name))
    throw Error(ErrorCode::invalid_argument, where + "the directory already holds a checkpoint");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(ErrorCode::system, where + "cannot create the directory: " + ec.message());
  open_checkpoint_dir(dir);  // refused now rather than by the writer thread (which checks again)
  for (const auto& [name, t] : extras.buffers)
    if (!plain(name)) throw Error(ErrorCode::invalid_argument, where + "buffer name '" + name + "' has whitespace");
  auto entries = checkpoint_entries(params, optimizer);
  for (auto& e : shared_extra_entries(extras)) entries.push_back(std::move(e));
  const auto owners = shard_owners(entries, world);
  for (std::size_t i = 0; i < entries.size(); ++i)
    if (owners[i] == rank)
      job.mine.push_back({entries[i].name, entries[i].tensor.detach().clone(torch::MemoryFormat::Contiguous)});
  for (auto& e : rank_extra_entries(extras, rank))
    job.mine.push_back({e.name, e.tensor.detach().clone(torch::MemoryFormat::Contiguous)});
  return job;
}

CheckpointContents read_checkpoint(const std::string& dir, int world_size) {
  const std::string manifest_path = dir + "/" + manifest_name;
  if (!name_exists(manifest_path))
    throw Error(ErrorCode::invalid_argument,
                "tutti::libtorch checkpoint " + dir + " is incomplete: no MANIFEST (its writing never finished)");
  CheckpointContents c{decode_manifest(read_checkpoint_file(manifest_path, max_manifest_bytes), manifest_path), {}};
  if (c.manifest.world_size != world_size)
    throw Error(ErrorCode::mismatch, "tutti::libtorch checkpoint " + dir + " was written by " +
                                         std::to_string(c.manifest.world_size) + " ranks, this job has " +
                                         std::to_string(world_size));
  for (int r = 0; r < world_size; ++r) {
    const std::string path = dir + "/" + shard_name(r, world_size);
    const auto& expected = c.manifest.shards[static_cast<std::size_t>(r)];
    const std::string bytes = read_checkpoint_file(path, expected.bytes, expected.bytes);
    std::uint64_t checksum = 0;
    if (bytes.size() >= 8) std::memcpy(&checksum, bytes.data() + bytes.size() - 8, 8);
    if (checksum != expected.checksum)
      throw Error(ErrorCode::invalid_argument, "tutti::libtorch checkpoint: shard " + path +
                                                   " is damaged: it is not the shard its MANIFEST names (checksum)");
    for (auto& e : decode_shard(bytes, path, r, world_size))
      if (!c.tensors.emplace(e.name, std::move(e.tensor)).second)
        throw Error(ErrorCode::invalid_argument,
                    "tutti::libtorch checkpoint: " + path + " is damaged: entry " + e.name + " is in two shards");
  }
  return c;
}

void restore_checkpoint(CheckpointContents c, const std::string& dir, const NamedTensors& params,
                        torch::optim::Optimizer& optimizer, const std::function<void()>& before_writing,
                        const CheckpointExtras& extras, int rank) {
  const std::string where = "tutti::libtorch checkpoint " + dir + ": ";
  if (c.manifest.optimizer != optimizer_type(optimizer))
    throw Error(ErrorCode::mismatch,
                where + "written for " + c.manifest.optimizer + ", not " + optimizer_type(optimizer));
  for (std::size_t i = 0; i < std::max(params.size(), c.manifest.params.size()); ++i) {
    const std::string mine = i < params.size() ? params[i].first + " " + shape_of(params[i].second) : "nothing";
    const auto& theirs = c.manifest.params;
    const std::string saved = i < theirs.size() ? theirs[i].first + " " + theirs[i].second : "nothing";
    if (mine != saved)
      throw Error(ErrorCode::mismatch, where + "written for another model: parameter " + std::to_string(i) + " is " +
                                           saved + " there, " + mine + " here");
  }
  auto take = [&](const std::string& name, const torch::Tensor& like) {
    auto it = c.tensors.find(name);
    if (it == c.tensors.end()) return torch::Tensor();
    if (it->second.sizes() != like.sizes() || it->second.scalar_type() != like.scalar_type())
      throw Error(ErrorCode::invalid_argument,
                  where + "damaged: " + name + " is " + shape_of(it->second) + ", expected " + shape_of(like));
    return c.tensors.extract(it).mapped();
  };
  std::vector<torch::Tensor> values;
  for (const auto& [name, t] : params) {
    values.push_back(take("param/" + name, t));
    if (!values.back().defined()) throw Error(ErrorCode::invalid_argument, where + "damaged: no entry for " + name);
  }
  const auto codec = state_codec(optimizer);
  std::vector<std::map<std::string, torch::Tensor>> states(params.size());
  for (std::size_t i = 0; codec && i < params.size(); ++i)
    for (const auto& field : codec->fields) {
      auto value = take("state/" + params[i].first + "/" + field,
                        field == "step" ? torch::zeros({1}, torch::kInt64) : params[i].second);
      if (value.defined()) states[i][field] = value;
    }
  const auto kind = kind_of(optimizer);
  std::vector<std::vector<double>> groups;
  for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    const auto options = group_options(kind, optimizer.param_groups()[g].options());
    auto value = take("group/" + std::to_string(g), torch::tensor(options, torch::kFloat64));
    if (!value.defined()) throw Error(ErrorCode::mismatch, where + "no options for param group " + std::to_string(g));
    groups.emplace_back(value.data_ptr<double>(), value.data_ptr<double>() + value.numel());
  }
  std::vector<torch::Tensor> buffers;
  for (const auto& [name, t] : extras.buffers) {
    buffers.push_back(take("buffer/" + name, t));
    if (!buffers.back().defined()) throw Error(ErrorCode::mismatch, where + "written without the buffer " + name);
  }
  // Bytes (u8, one dimension) of any length.
  auto take_bytes = [&](const std::string& name) {
    auto it = c.tensors.find(name);
    if (it == c.tensors.end()) return torch::Tensor();
    if (it->second.dim() != 1 || it->second.scalar_type() != torch::kUInt8)
      throw Error(ErrorCode::invalid_argument, where + "damaged: " + name + " is " + shape_of(it->second));
    return c.tensors.extract(it).mapped();
  };
  auto span_of = [](const torch::Tensor& t) {
    return t.defined() ? std::span(static_cast<const std::byte*>(t.data_ptr()), t.nbytes())
                       : std::span<const std::byte>();
  };
  const std::string mine = "rank/" + std::to_string(rank) + "/";
  std::optional<compress::GradientCompressor> compressor;
  if (extras.compressor) {
    const std::string text = extras.compressor->compression().to_string();
    const auto shared = take_bytes("compressor/" + text), local = take_bytes(mine + "compressor/" + text);
    if (shared.defined()) {
      compressor.emplace(extras.compressor->compression(), extras.compressor->seed());
      compressor->load_state(span_of(shared), span_of(local));
    }
  }
  torch::Tensor generator;
  if (extras.generator) generator = take(mine + "generator", cpu_generator_state());
  // Another compression's state (a run resumed with another --compression starts its compressor
  // afresh) and the other ranks' own entries.
  std::erase_if(c.tensors,
                [](const auto& e) { return e.first.starts_with("compressor/") || e.first.starts_with("rank/"); });
  if (!c.tensors.empty())
    throw Error(ErrorCode::invalid_argument, where + "entry " + c.tensors.begin()->first + " belongs to nothing here");
  for (std::size_t i = 0; i < states.size(); ++i)
    if (!states[i].empty() && codec->fields.front() == "step" && !states[i].count("step"))
      throw Error(ErrorCode::invalid_argument, where + "damaged: the state of " + params[i].first + " has no step");
  before_writing();

  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params.size(); ++i) {
    params[i].second.copy_(values[i]);
    if (states[i].empty())
      optimizer.state().erase(state_key(params[i].second));
    else
      optimizer.state()[state_key(params[i].second)] = codec->make(states[i]);
  }
  for (std::size_t g = 0; g < groups.size(); ++g)
    set_group_options(kind, optimizer.param_groups()[g].options(), groups[g]);
  for (std::size_t i = 0; i < buffers.size(); ++i) extras.buffers[i].second.copy_(buffers[i]);
  if (compressor) *extras.compressor = std::move(*compressor);
  if (generator.defined()) set_cpu_generator_state(generator);
}

void agree_on_load(Communicator& comm, const std::string& dir, const std::exception_ptr& failure) {
  constexpr std::size_t text_bytes = 1024, record = 4 + text_bytes;  // i32 code + 1 (0: loaded), text
  std::string mine(record, '\0');
  if (failure) {
    std::int32_t code = static_cast<std::int32_t>(ErrorCode::system) + 1;
    std::string text;
    try {
      std::rethrow_exception(failure);
    } catch (const Error& e) {
      code = static_cast<std::int32_t>(e.code()) + 1;
      text = e.what();
    } catch (const std::exception& e) {
      text = e.what();
    } catch (...) {
      text = "an unknown exception";
    }
    std::memcpy(mine.data(), &code, 4);
    text.copy(mine.data() + 4, text_bytes - 1);
  }
  std::string all(record * static_cast<std::size_t>(comm.size()), '\0');
  comm.allgather(mine.data(), all.data(), record, DataType::u8);
  std::optional<std::size_t> first;
  std::string others;
  for (std::size_t r = 0; r < static_cast<std::size_t>(comm.size()); ++r) {
    std::int32_t code;
    std::memcpy(&code, all.data() + r * record, 4);
    if (code == 0) continue;
    if (first) others += (others.empty() ? "" : ", ") + std::to_string(r);
    if (!first) first = r;
  }
  if (!first) return;
  const char* record_of_first = all.data() + *first * record;
  std::int32_t code;
  std::memcpy(&code, record_of_first, 4);
  const auto known = code >= 1 && code <= static_cast<std::int32_t>(ErrorCode::system) + 1;
  const std::string text(record_of_first + 4, ::strnlen(record_of_first + 4, text_bytes));  // bounded by the record
  throw Error(known ? static_cast<ErrorCode>(code - 1) : ErrorCode::system,
              "tutti::libtorch checkpoint " + dir + ": nothing restored on any rank: rank " + std::to_string(*first) +
                  " could not load it" + (others.empty() ? "" : " (nor could rank(s) " + others + ")") + ": " + text);
}

CheckpointMetadata load_checkpoint(Communicator& comm, const std::string& dir, const NamedTensors& params,
                                   torch::optim::Optimizer& optimizer, const CheckpointExtras& extras) {
  bool agreed = false;
  try {
    auto contents = read_checkpoint(dir, comm.size());
    CheckpointMetadata metadata = contents.manifest.metadata;
    restore_checkpoint(
        std::move(contents), dir, params, optimizer,
        [&] {
          agreed = true;
          agree_on_load(comm, dir, nullptr);
        },
        extras, comm.rank());
    return metadata;
  } catch (...) {
    if (agreed) throw;
    agreed = true;
    agree_on_load(comm, dir, std::current_exception());
    throw;  // not reached: agree_on_load throws when a rank failed
  }
}

long long optimizer_steps_of(const Manifest& manifest, const std::string& path) {
  const auto it = manifest.metadata.find("optimizer_steps");
  if (it == manifest.metadata.end()) return 0;
  try {
    return std::stoll(it->second);
  } catch (const std::logic_error&) {
    throw Error(ErrorCode::invalid_argument, "checkpoint: " + path + " is damaged: optimizer_steps is not a number");
  }
}

}  // namespace detail

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  std::optional<std::string> best;
  long long best_steps = -1;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string path = entry.path().string() + "/" + detail::manifest_name;
    if (!detail::name_exists(path)) continue;
    try {
      const auto manifest =
          detail::decode_manifest(detail::read_checkpoint_file(path, detail::max_manifest_bytes), path);
      const long long steps = detail::optimizer_steps_of(manifest, path);
      if (steps > best_steps) {
        best_steps = steps;
        best = entry.path().string();
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tutti: warning: checkpoint passed over: %s\n", e.what());
    }
  }
  return best;
}

std::optional<std::string> latest_checkpoint(Communicator& comm, const std::string& dir) {
  std::uint64_t head[2] = {0, 0};  // 0: none, 1: found, 2: error; bytes of the text
  std::string text;
  if (comm.rank() == 0) {
    try {
      std::error_code ec;
      if (!std::filesystem::is_directory(dir, ec))
        throw Error(ErrorCode::invalid_argument,
                    "tutti::libtorch checkpoint directory " + dir + " does not exist or is not a directory");
      if (auto best = latest_checkpoint(dir)) {
        head[0] = 1;
        text = *best;
      }
    } catch (const std::exception& e) {  // shared, so that every rank throws it
      head[0] = 2;
      text = std::string(e.what()) + " (rank 0)";
    }
    head[1] = text.size();
  }
  comm.broadcast(head, 2, DataType::u64, 0);
  text.resize(static_cast<std::size_t>(head[1]));
  if (!text.empty()) comm.broadcast(text.data(), text.size(), DataType::u8, 0);
  if (head[0] == 2) throw Error(ErrorCode::invalid_argument, text);
  if (head[0] == 1) return text;
  return std::nullopt;
}

}  // namespace tutti::libtorch
