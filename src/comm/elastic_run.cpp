// The state an elastic job returns to, and the loop that keeps training going over changes of
// membership (include/tutti/elastic.hpp).
#include <filesystem>
#include <fstream>
#include <optional>

#include "core/log.hpp"
#include "tutti/elastic.hpp"

namespace tutti::elastic {

namespace {

// A rank died (peer_failure), hung (timeout), or the communicator was aborted by a rank that saw
// either: the job can go on without it. Anything else is the program's or the user's error.
bool recoverable(const Error& e) {
  return e.code() == ErrorCode::peer_failure || e.code() == ErrorCode::timeout || e.code() == ErrorCode::aborted;
}

// The checkpoint's bytes; nullopt when there is none. One that is there but cannot be read is an
// error: starting afresh would lose what it holds.
std::optional<std::vector<std::byte>> read_checkpoint(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::file_type type = fs::status(path, error).type();
  if (type == fs::file_type::not_found) return std::nullopt;
  std::vector<std::byte> bytes;
  std::ifstream file;
  if (type == fs::file_type::regular) {
    bytes.resize(static_cast<std::size_t>(fs::file_size(path, error)));
    file.open(path, std::ios::binary);
    file.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  if (type != fs::file_type::regular || error || !file)
    throw Error(ErrorCode::system, "elastic: cannot read the checkpoint " + path +
                                       " that a job below its minimum of ranks left (remove it to start afresh)");
  return bytes;
}

}  // namespace

void State::commit() {
  committed_ = save();
  committed_local_ = save_local();
  ++commits_;
  if (job_ == nullptr) return;
  Communicator& world = job_->communicator();
  // Rank 0 asks the store; every rank hears the same answer, so all rebuild here or none does.
  std::int64_t waiting = world.rank() == 0 ? job_->waiting() : 0;
  world.allreduce(&waiting, &waiting, 1, DataType::i64, ReduceOp::max);
  if (waiting > 0)
    throw MembershipChanged("elastic: " + std::to_string(waiting) +
                            " rank(s) wait to join: every rank rebuilds the job at this commit");
}

void State::restore() {
  if (commits_ == 0) return;
  load(committed_);
  load_local(committed_local_);
}

void State::sync() {
  if (job_ == nullptr) throw Error(ErrorCode::invalid_argument, "elastic: State::sync outside elastic::run");
  Communicator& world = job_->communicator();
  std::vector<std::byte> bytes;
  if (world.rank() == 0) bytes = save();
  std::uint64_t size = bytes.size();
  world.broadcast(&size, 1, DataType::u64, 0);
  bytes.resize(size);
  if (size > 0) world.broadcast(bytes.data(), size, DataType::u8, 0);
  if (world.rank() != 0) load(bytes);
  committed_ = std::move(bytes);
  committed_local_ = save_local();  // this rank's own, as it is: a joiner's is empty
  ++commits_;
}

void run(Job& job, State& state, const std::function<void(Communicator&)>& train) {
  state.job_ = &job;
  // A job that fell below its minimum left its last commit there: rank 0 starts from it, and the
  // first sync gives it to every rank.
  if (job.generation() == 0 && job.communicator().rank() == 0 && !job.checkpoint().empty())
    if (const auto bytes = read_checkpoint(job.checkpoint())) {
      state.load(*bytes);
      core::log(core::LogLevel::warn, 0,
                "elastic: starting from the checkpoint " + job.checkpoint() + " (" + std::to_string(bytes->size()) +
                    " bytes) that a job below its minimum of ranks left");
    }
  struct Unbind {
    State& state;
    ~Unbind() { state.job_ = nullptr; }
  } unbind{state};
  for (;;) {
    std::string failure;
    try {
      state.sync();
      train(job.communicator());
      job.finish();
      return;
    } catch (const MembershipChanged&) {
      // Ranks join: everyone committed just now, nothing to go back to.
    } catch (const Error& e) {
      if (!recoverable(e)) {
        job.leave();
        throw;
      }
      failure = e.what();
      core::log(core::LogLevel::warn, job.communicator().rank(),
                "elastic: generation " + std::to_string(job.generation()) + " failed (" + failure +
                    "): back to the last commit");
      state.restore();
    }
    job.rebuild(failure, &state);
  }
}

}  // namespace tutti::elastic
