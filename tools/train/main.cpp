// tutti-train: data-parallel training of a small CNN on Fashion-MNIST over Tutti's engine.
//
//   tutti-run -n 2 tutti-train [--epochs N] [--batch-size B] [--no-overlap] [--timeline FILE]
//                              [--profile FILE] [--straggler RANK:FACTOR] …
//
// Rank 0 prints a header, one line per epoch (loss, test accuracy, throughput, allreduce volume
// and how much of it backward hid) and a summary line; at the end every rank checks that the
// parameters are bit-identical on all ranks. Exit status: 0, 1 on error (or differing parameters,
// or a NaN loss), 2 for a bad command line.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "checkpointing.hpp"
#include "common/progress.hpp"
#include "settings.hpp"
#include "trainer.hpp"
#include "tutti/compress.hpp"
#include "tutti/elastic.hpp"
#include "tutti/tutti.hpp"

namespace {

using tutti::train::EpochResult;
using tutti::train::Settings;

// c10::Error's what() carries a C++ backtrace; the message alone is enough here.
const char* message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

// Rank 0's view of an epoch while it runs: the progress line on a terminal (--no-progress: none)
// and, every --log-interval steps, a line on stdout: the step, the loss of its own batch (where
// rank 0 computes the loss: the last pipeline stage), the samples per second so far over every
// data-parallel rank, and the epoch's ETA. Nothing on the other ranks, nor any communication.
class EpochProgress {
 public:
  EpochProgress(bool root, const Settings& s, const tutti::train::Trainer& trainer, int epoch, std::int64_t first)
      : s_(s),
        epoch_(epoch),
        first_(first),
        steps_(trainer.steps_per_epoch()),
        global_batch_(trainer.layout().data * s.batch_size),
        holds_loss_(trainer.layout().last_stage() && trainer.layout().t == 0),
        root_(root),
        line_(root && s.progress, static_cast<double>(steps_ - first)),
        start_(std::chrono::steady_clock::now()) {}

  void step_done(std::int64_t step, double loss) {
    if (!root_) return;
    const double done = static_cast<double>(step + 1 - first_);
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double samples_per_second = elapsed > 0 ? done * static_cast<double>(global_batch_) / elapsed : 0;
    char what[160];
    std::snprintf(what, sizeof what, "epoch %d/%d  step %lld/%lld  samples/s %.0f", epoch_, s_.epochs,
                  static_cast<long long>(step + 1), static_cast<long long>(steps_), samples_per_second);
    if (s_.log_interval > 0 && (step + 1) % s_.log_interval == 0) {
      line_.finish();
      const double eta = elapsed * (static_cast<double>(steps_ - first_) - done) / done;
      std::printf("epoch %d/%d  step %lld/%lld", epoch_, s_.epochs, static_cast<long long>(step + 1),
                  static_cast<long long>(steps_));
      if (holds_loss_) std::printf("  loss %.4f", loss);
      std::printf("  samples/s %.0f  eta %.1f s\n", samples_per_second, eta);
      std::fflush(stdout);
    }
    line_.update(what, done);
  }
  void finish() { line_.finish(); }

 private:
  const Settings& s_;
  const int epoch_;
  const std::int64_t first_, steps_, global_batch_;
  const bool holds_loss_, root_;
  tutti::tools::Progress line_;
  const std::chrono::steady_clock::time_point start_;
};

void print_epoch(int epoch, const Settings& s, const EpochResult& r) {
  std::printf(
      "epoch %d/%d  loss %.4f  test-acc %.2f%%  samples/s %.0f  step %.2f ms  allreduce %.1f MB in %.3f s  "
      "overlapped %.1f%%  exposed %.3f ms/step  hidden %.1f%%\n",
      epoch, s.epochs, r.train_loss, 100 * r.test_accuracy, r.samples_per_second, 1e3 * r.step_seconds,
      static_cast<double>(r.overlap.bytes) / 1e6, r.overlap.allreduce_seconds, 100 * r.overlapped_fraction,
      1e3 * r.exposed_seconds, 100 * r.hidden_fraction);
  std::fflush(stdout);
}

// Every rank hashes its part of the parameters; the ranks that hold the same part (a
// data-parallel group) compare theirs with that group's first rank. True on every rank if all
// groups agree.
bool parameters_identical(tutti::Communicator& comm, tutti::train::Trainer& trainer) {
  tutti::Communicator& group = trainer.data_group();
  const std::uint64_t mine = trainer.parameter_checksum();
  std::vector<std::uint64_t> all(static_cast<std::size_t>(group.size()));
  group.allgather(&mine, all.data(), 1, tutti::DataType::u64);
  std::string differing;
  for (std::size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0]) differing += (differing.empty() ? "" : ", ") + std::to_string(r);
  if (!differing.empty())
    std::fprintf(stderr,
                 "tutti-train: error: rank %d: the parameters of data-parallel rank(s) %s of its group differ from "
                 "the group's rank 0 after training\n",
                 comm.rank(), differing.c_str());
  std::int32_t bad = differing.empty() ? 0 : 1;
  comm.allreduce(&bad, &bad, 1, tutti::DataType::i32, tutti::ReduceOp::max);
  if (bad) return false;
  const auto& l = trainer.layout();
  if (comm.rank() == 0 && l.pipeline * l.tensor == 1)
    std::printf("tutti-train: parameters identical on all %d ranks (checksum 0x%016llx)\n", comm.size(),
                static_cast<unsigned long long>(all[0]));
  else if (comm.rank() == 0)
    std::printf(
        "tutti-train: parameters identical on the %d data-parallel ranks of each of %d groups (rank 0's "
        "checksum 0x%016llx)\n",
        l.data, l.pipeline * l.tensor, static_cast<unsigned long long>(all[0]));
  return true;
}

// The layout, its pipeline's bubble against (N-1)/(M+N-1), and the memory of each rank.
void print_parallel_summary(tutti::Communicator& comm, const Settings& s, tutti::train::Trainer& trainer,
                            const EpochResult& last) {
  const auto& l = trainer.layout();
  const auto m = trainer.memory_use();
  // Per rank: idle fraction, parameters, optimizer state, gradients kept, peak RSS, and the
  // pipeline's compute and step time per step.
  constexpr std::size_t n = 7;
  const double mine[n] = {last.idle_fraction,
                          static_cast<double>(m.parameters),
                          static_cast<double>(m.optimizer_state),
                          static_cast<double>(m.gradients),
                          static_cast<double>(m.max_rss),
                          last.stage_compute_seconds,
                          last.stage_step_seconds};
  std::vector<double> all(n * static_cast<std::size_t>(comm.size()));
  comm.allgather(mine, all.data(), n, tutti::DataType::f64);
  if (comm.rank() != 0) return;
  std::printf("tutti-train: layout data=%d pipeline=%d tensor=%d zero=%d schedule=%s micro-batches=%d\n", l.data,
              l.pipeline, l.tensor, s.zero, s.schedule.c_str(), s.micro_batches);
  for (int r = 0; r < comm.size(); ++r) {
    const double* v = &all[n * static_cast<std::size_t>(r)];
    std::printf("tutti-train: rank %d params_mb=%.3f optimizer_state_mb=%.3f gradients_mb=%.3f max_rss_mb=%.1f", r,
                v[1] / 1e6, v[2] / 1e6, v[3] / 1e6, v[4] / 1e6);
    if (l.pipeline > 1) std::printf(" compute_ms=%.2f pipeline_step_ms=%.2f idle=%.3f", 1e3 * v[5], 1e3 * v[6], v[0]);
    std::printf("\n");
  }
  if (const auto* ooc = trainer.out_of_core()) {
    const auto c = ooc->counters();
    constexpr double mib = 1 << 20;
    std::printf(
        "tutti-train: device memory (rank 0, MiB) budget=%.1f peak=%.1f parameters_and_gradients=%.1f "
        "swapped_out=%.1f swapped_in=%.1f swap_wait_ms=%.1f prefetch_hits=%llu\n",
        static_cast<double>(s.device_memory) / mib, static_cast<double>(c.peak_bytes) / mib,
        static_cast<double>(ooc->parameter_bytes()) / mib, static_cast<double>(c.swapped_out_bytes) / mib,
        static_cast<double>(c.swapped_in_bytes) / mib, std::chrono::duration<double, std::milli>(c.waited).count(),
        static_cast<unsigned long long>(c.prefetch_hits));
  }
  if (l.pipeline > 1)
    std::printf("tutti-train: pipeline bubble theory (N-1)/(M+N-1) = %.3f for equal stages\n",
                tutti::libtorch::pipeline_bubble_theory(l.pipeline, s.micro_batches));
}

int train(tutti::Communicator& comm, const Settings& s) {
  if (s.straggler && s.straggler->rank >= comm.size()) {  // every rank finds it: all leave alike
    std::fprintf(stderr, "tutti-train: --straggler: rank %d is not in a job of %d ranks (see --help)\n",
                 s.straggler->rank, comm.size());
    return 2;
  }
  if (!s.profile.empty()) {  // every rank learns whether any cannot write: all leave alike
    const std::string problem = tutti::train::profile_path_problem(s, comm.rank());
    std::int32_t bad = problem.empty() ? 0 : 1;
    comm.allreduce(&bad, &bad, 1, tutti::DataType::i32, tutti::ReduceOp::max);
    if (!problem.empty()) std::fprintf(stderr, "tutti-train: --profile: %s (see --help)\n", problem.c_str());
    if (bad) return 2;
  }
  torch::set_num_threads(s.threads);
  const tutti::train::Data data = tutti::train::load_data(s);
  tutti::train::Trainer trainer(comm, s, data);
  const bool root = comm.rank() == 0;
  if (root) {
    // Gradients compressed other than to 16 bits are reduced after backward
    // (DistributedOptimizer::reduce_compressed).
    using Kind = tutti::compress::Compression::Kind;
    const Kind kind = tutti::compress::Compression::parse(s.compression).kind;
    const bool overlap = s.overlap && (kind == Kind::none || kind == Kind::fp16 || kind == Kind::bf16);
    std::printf(
        "tutti-train: p=%d batch=%lld/rank lr=%g threads=%d overlap=%s compression=%s fusion=%zu params=%lld "
        "data=%s\n",
        comm.size(), static_cast<long long>(s.batch_size), s.lr, s.threads, overlap ? "on" : "off",
        s.compression.c_str(), trainer.fusion_threshold(), static_cast<long long>(trainer.parameter_count()),
        s.data.c_str());
    std::fflush(stdout);
  }
  EpochResult last;
  // Checkpoints are for data parallelism alone (parse_settings refuses them otherwise).
  std::optional<tutti::train::Checkpointing> checkpointing;
  if (trainer.optimizer()) checkpointing.emplace(s, *trainer.optimizer(), trainer.steps_per_epoch());
  try {
    const tutti::train::ResumePoint start = checkpointing ? checkpointing->resume(comm) : tutti::train::ResumePoint{};
    for (int epoch = start.epoch; epoch <= s.epochs; ++epoch) {
      const std::int64_t first = epoch == start.epoch ? start.step : 0;
      EpochProgress progress(root, s, trainer, epoch, first);
      last = trainer.run_epoch(epoch, first, [&](std::int64_t step, double loss) {
        if (checkpointing) checkpointing->after_step(epoch, step);
        progress.step_done(step, loss);
      });
      progress.finish();
      if (std::isnan(last.train_loss)) {
        std::fprintf(stderr, "tutti-train: error: the training loss is NaN in epoch %d (try a smaller --lr)\n", epoch);
        return 1;
      }
      if (root) print_epoch(epoch, s, last);
    }
    if (checkpointing) checkpointing->finish();
  } catch (const std::exception& e) {
    // Leave at once: the engine's shutdown is collective, and the other ranks may never join it.
    std::fprintf(stderr, "tutti-train: error: %s\n", message_of(e));
    std::fflush(nullptr);
    std::_Exit(1);
  }
  if (!parameters_identical(comm, trainer)) return 1;
  if (!s.profile.empty()) tutti::train::save_profile(s, comm, trainer.compute_timer(), trainer.fusion_threshold());
  if (root && checkpointing && checkpointing->taken() > 0)
    std::printf("tutti-train: checkpoints %lld call_ms=%.3f (rank 0's mean time in the call%s)\n",
                static_cast<long long>(checkpointing->taken()),
                1e3 * checkpointing->call_seconds() / checkpointing->taken(),
                s.checkpoint_blocking ? ", the write included" : "; the write goes on in the background");
  print_parallel_summary(comm, s, trainer, last);
  if (root) {
    const double hidden = last.hidden_fraction;
    std::printf(
        "tutti-train: summary step_ms=%.2f samples_per_s=%.0f hidden=%.3f overlapped=%.3f test_acc=%.4f loss=%.4f\n",
        1e3 * last.step_seconds, last.samples_per_second, hidden, last.overlapped_fraction, last.test_accuracy,
        last.train_loss);
    std::fflush(stdout);
  }
  return 0;
}

// --elastic: what the job needs to go on after a change of membership. The shared part, the same
// on every rank: the position in training and the Trainer's state (parameters, buffers, momentum,
// the CPU generator), and the compressor's step and PowerSGD's Q. The local part, this rank's own:
// its compressor's error-feedback residuals (a rank that joins starts them from zero).
struct ElasticState final : tutti::elastic::State {
  struct Position {
    std::int64_t epoch = 1;
    std::int64_t sample = 0;                    // samples of the epoch's order trained on
    std::int64_t steps = 0;                     // optimizer steps over the run
    std::uint64_t weights = 0, compressor = 0;  // the bytes that follow, of each
  } at;
  std::vector<std::byte> weights;  // Trainer::save_state; empty: the Trainer's own start
  tutti::compress::CompressorState compressor;

  // At a commit point: what the trainer holds now.
  void take(const tutti::train::Trainer& trainer) {
    weights = trainer.save_state();
    compressor = trainer.compressor_state();
  }
  // In a new generation: the trainer goes on from here.
  void give(tutti::train::Trainer& trainer) const {
    if (!weights.empty()) trainer.load_state(weights);
    trainer.load_compressor_state(compressor.shared, compressor.local);
  }

 protected:
  std::vector<std::byte> save() const override {
    Position header = at;
    header.weights = weights.size();
    header.compressor = compressor.shared.size();
    std::vector<std::byte> bytes(sizeof header);
    std::memcpy(bytes.data(), &header, sizeof header);
    bytes.insert(bytes.end(), weights.begin(), weights.end());
    bytes.insert(bytes.end(), compressor.shared.begin(), compressor.shared.end());
    return bytes;
  }
  void load(std::span<const std::byte> bytes) override {
    Position header;
    if (bytes.size() >= sizeof header) std::memcpy(&header, bytes.data(), sizeof header);
    const std::uint64_t rest = bytes.size() - std::min(bytes.size(), sizeof header);
    if (bytes.size() < sizeof header || header.weights > rest || header.compressor != rest - header.weights)
      throw std::runtime_error("tutti-train: an elastic state of " + std::to_string(bytes.size()) +
                               " bytes that is not one");
    at = header;
    const auto* w = bytes.data() + sizeof header;
    weights.assign(w, w + header.weights);
    compressor.shared.assign(w + header.weights, bytes.data() + bytes.size());
  }
  std::vector<std::byte> save_local() const override { return compressor.local; }
  void load_local(std::span<const std::byte> bytes) override { compressor.local.assign(bytes.begin(), bytes.end()); }
};

int train_elastic(const Settings& s) {
  using Clock = std::chrono::steady_clock;
  torch::set_num_threads(s.threads);
  const tutti::train::Data data = tutti::train::load_data(s);
  tutti::elastic::Job job;
  ElasticState state;
  EpochResult last;
  int status = 0;
  auto last_step = Clock::now();
  tutti::elastic::run(job, state, [&](tutti::Communicator& world) {
    const bool root = world.rank() == 0;
    const double lost_ms = std::chrono::duration<double, std::milli>(Clock::now() - last_step).count();
    tutti::train::Trainer trainer(world, s, data);
    state.give(trainer);
    if (root) {
      if (job.generation() == 0)
        std::printf("tutti-train: elastic p=%d batch=%lld/rank lr=%g compression=%s commit-every=%lld\n", world.size(),
                    static_cast<long long>(s.batch_size), s.lr, s.compression.c_str(),
                    static_cast<long long>(s.commit_every));
      else
        std::printf(
            "tutti-train: elastic generation %d: %d ranks, from epoch %d sample %lld (step %lld), %.0f ms after "
            "the last step done\n",
            job.generation(), world.size(), static_cast<int>(state.at.epoch), static_cast<long long>(state.at.sample),
            static_cast<long long>(state.at.steps), lost_ms);
      std::fflush(stdout);
    }
    const std::int64_t global_batch = static_cast<std::int64_t>(world.size()) * s.batch_size;
    while (state.at.epoch <= s.epochs) {
      last = trainer.run_epoch(
          static_cast<int>(state.at.epoch), 0,
          [&](std::int64_t, double loss) {
            state.at.sample += global_batch;
            ++state.at.steps;
            last_step = Clock::now();
            if (root && s.log_interval > 0 && state.at.steps % s.log_interval == 0) {
              std::printf("tutti-train: step %lld epoch %d loss %.4f\n", static_cast<long long>(state.at.steps),
                          static_cast<int>(state.at.epoch), loss);
              std::fflush(stdout);
            }
            if (state.at.steps % s.commit_every == 0) {
              state.take(trainer);
              state.commit();
            }
          },
          state.at.sample);
      if (std::isnan(last.train_loss)) throw std::runtime_error("the training loss is NaN (try a smaller --lr)");
      if (root) print_epoch(static_cast<int>(state.at.epoch), s, last);
      ++state.at.epoch;
      state.at.sample = 0;
      state.take(trainer);
      state.commit();
    }
    if (!parameters_identical(world, trainer)) status = 1;
    if (root) {
      std::printf(
          "tutti-train: summary step_ms=%.2f samples_per_s=%.0f test_acc=%.4f loss=%.4f ranks=%d generation=%d\n",
          1e3 * last.step_seconds, last.samples_per_second, last.test_accuracy, last.train_loss, world.size(),
          job.generation());
      std::fflush(stdout);
    }
  });
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings;
  try {
    settings = tutti::train::parse_settings(argc, argv);
  } catch (const tutti::train::UsageError& e) {
    const bool named = std::string_view(e.what()).find("--help") != std::string_view::npos;  // unknown flags
    std::fprintf(stderr, "tutti-train: %s%s\n", e.what(), named ? "" : " (see --help)");
    return 2;
  }
  if (settings.help) return 0;  // parse_settings printed the flags
  try {
    if (settings.elastic) return train_elastic(settings);
    tutti::Communicator comm = tutti::init();
    return train(comm, settings);
  } catch (const tutti::train::UsageError& e) {  // a layout the job's ranks do not fit: every rank says so
    std::fprintf(stderr, "tutti-train: %s (see --help)\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tutti-train: error: %s\n", message_of(e));
  }
  return 1;
}
