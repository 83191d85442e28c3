#include "settings.hpp"

#include <cmath>
#include <limits>
#include <optional>
#include <string_view>

#include "common/cli.hpp"
#include "tutti/compress.hpp"
#include "tutti/torch_pipeline.hpp"

namespace tutti::train {

namespace {

template <class T>
T number(std::string_view flag, std::string_view text) {
  const std::optional<T> value = tools::read_number<T>(text);
  if (!value) throw UsageError(std::string(flag) + " needs a number, not '" + std::string(text) + "'");
  return *value;
}

template <class T>
T at_least(std::string_view flag, T value, T minimum) {
  if (value < minimum) throw UsageError(std::string(flag) + " must be at least " + std::to_string(minimum));
  return value;
}

// RANK:FACTOR, FACTOR a finite number >= 1.
Straggler straggler(std::string_view flag, std::string_view text) {
  const auto colon = text.find(':');
  if (colon == std::string_view::npos)
    throw UsageError(std::string(flag) + " needs RANK:FACTOR (e.g. 1:1.5), not '" + std::string(text) + "'");
  Straggler s;
  s.rank = at_least(flag, number<int>(flag, text.substr(0, colon)), 0);
  s.factor = number<double>(flag, text.substr(colon + 1));
  if (!(s.factor >= 1) || !std::isfinite(s.factor))
    throw UsageError(std::string(flag) + ": FACTOR must be a finite number >= 1, not '" +
                     std::string(text.substr(colon + 1)) + "'");
  return s;
}

void check_checkpoint_settings(const Settings& s) {
  if (s.checkpoint_dir.empty() != (s.checkpoint_every == 0))
    throw UsageError("--checkpoint DIR and --checkpoint-every N go together");
  if (s.checkpoint_blocking && s.checkpoint_dir.empty()) throw UsageError("--checkpoint-blocking needs --checkpoint");
}

// An elastic job holds parameters, buffers, momentum and the sampler's position in its state:
// data parallelism alone, one backward pass per step, no checkpoint directory of its own.
void check_elastic_settings(const Settings& s) {
  if (!s.elastic) return;
  if (beyond_data_parallel(s))
    throw UsageError(
        "--elastic is for data parallelism alone (not with --pipeline, --tensor-parallel, --zero or "
        "--device-memory)");
  if (s.backward_passes > 1) throw UsageError("--elastic takes one backward pass per step (--backward-passes 1)");
  if (!s.checkpoint_dir.empty() || !s.resume.empty() || !s.profile.empty())
    throw UsageError("--elastic keeps its state in memory: not with --checkpoint, --resume or --profile");
}

// The model-parallel and memory flags: values that fit together, before any rank starts.
void check_parallel_settings(const Settings& s) {
  if (s.micro_batches > 1 && s.pipeline == 1) throw UsageError("--micro-batches needs --pipeline N (N > 1)");
  if (s.batch_size % s.micro_batches != 0)
    throw UsageError("--micro-batches " + std::to_string(s.micro_batches) + " does not divide --batch-size " +
                     std::to_string(s.batch_size));
  if (s.pipeline > 1 && s.backward_passes > 1)
    throw UsageError("--pipeline accumulates its micro-batches itself: leave --backward-passes at 1");
  if (!s.swap && s.device_memory == 0) throw UsageError("--no-swap needs --device-memory MB");
  if (s.device_memory > 0 && (s.pipeline > 1 || s.tensor_parallel > 1 || s.zero > 0))
    throw UsageError(
        "--device-memory trains the whole network on each rank: not with --pipeline, --tensor-parallel "
        "or --zero");
  if (beyond_data_parallel(s) && (!s.profile.empty() || !s.checkpoint_dir.empty() || !s.resume.empty()))
    throw UsageError(
        "--profile, --checkpoint and --resume are for data parallelism alone (not with --pipeline, "
        "--tensor-parallel, --zero or --device-memory)");
  if (beyond_data_parallel(s) &&
      tutti::compress::Compression::parse(s.compression).kind != tutti::compress::Compression::Kind::none)
    throw UsageError("--compression is for data parallelism alone");
}

}  // namespace

bool beyond_data_parallel(const Settings& s) {
  return s.pipeline > 1 || s.tensor_parallel > 1 || s.zero > 0 || s.device_memory > 0;
}

namespace {

// A numeric flag of type T, at least `least`, read with number() and at_least()'s messages.
template <class T>
CLI::Option* add_number(CLI::App& app, const char* flag, T& target, T least, const std::string& help) {
  return app
      .add_option_function<std::string>(
          flag,
          [flag, &target, least](const std::string& text) { target = at_least(flag, number<T>(flag, text), least); },
          help)
      ->type_name("N");
}

template <class T>
CLI::Option* add_number(CLI::App& app, const char* flag, T& target, const std::string& help) {
  return add_number(app, flag, target, std::numeric_limits<T>::lowest(), help);
}

void add_run_flags(CLI::App& app, Settings& s) {
  add_number(app, "--epochs", s.epochs, 1, "epochs (default 2)");
  add_number<std::int64_t>(app, "--batch-size", s.batch_size, 1, "samples per rank per step (default 64)");
  add_number(app, "--lr", s.lr, "SGD learning rate, momentum 0.9 (default 0.05)")->type_name("X");
  add_number(app, "--threads", s.threads, 1, "torch threads per rank (default 1)");
  add_number(app, "--seed", s.seed, "initialization and shuffling seed (default 42)");
  app.add_flag(
      "--no-overlap", [&s](std::int64_t) { s.overlap = false; },
      "reduce all gradients after backward instead of during it");
  app.add_option("--timeline", s.timeline, "write the engine's Chrome trace to FILE")->type_name("FILE");
  tools::add_size(app, "--fusion-threshold", s.fusion_threshold,
                  "largest fused allreduce (default TUTTI_FUSION_THRESHOLD or 64 MiB)");
  add_number(app, "--backward-passes", s.backward_passes, 1,
             "backward passes accumulated per optimizer step (default 1)");
  add_number(app, "--train-samples", s.train_samples, "use the first N training samples (default 0: all 60000)");
  add_number(app, "--test-samples", s.test_samples, "evaluate on the first N test samples (default 0: all 10000)");
  app.add_option("--data", s.data, "the Fashion-MNIST files (default " + std::string(default_fashion_mnist_dir) + ")")
      ->type_name("DIR");
  app.add_option_function<std::string>(
         "--compression",
         [&s](const std::string& text) {
           s.compression = text;
           try {
             tutti::compress::Compression::parse(s.compression);
           } catch (const tutti::Error& e) {
             throw UsageError(std::string("--compression: ") + e.what());
           }
         },
         "how gradients travel: none (default), fp16, bf16, qsgd:BITS (4 or 8), powersgd:RANK or "
         "topk:RATIO[:WARMUP] (0 < RATIO <= 1; over the first WARMUP steps the share sent falls from all to "
         "RATIO); qsgd and topk with error feedback; all but fp16 and bf16 are reduced after backward")
      ->type_name("C");
  app.add_option("--profile", s.profile,
                 "write the run's model profile (forward, each gradient's backward segment, optimizer; means "
                 "after warm-up) to FILE, by rank 0, or by every rank when FILE holds {rank}")
      ->type_name("FILE");
  app.add_option_function<std::string>(
         "--straggler", [&s](const std::string& text) { s.straggler = straggler("--straggler", text); },
         "RANK's compute (forward, each backward segment, optimizer) takes F >= 1 times as long: it sleeps (F-1) "
         "times each segment after it")
      ->type_name("RANK:F");
  app.add_option("--loss-log", s.loss_log, "rank 0 writes each step's loss over the global batch to FILE")
      ->type_name("FILE");
  add_number<std::int64_t>(app, "--log-interval", s.log_interval, 0,
                           "rank 0 prints a line every N steps of an epoch (step, loss of its own batch, samples/s "
                           "so far, ETA of the epoch); default 0: none");
  app.add_flag(
      "--no-progress", [&s](std::int64_t) { s.progress = false; },
      "no progress line (on a terminal, rank 0 shows one within each epoch)");
}

void add_layout_flags(CLI::App& app, Settings& s) {
  app.add_option("--checkpoint", s.checkpoint_dir,
                 "with --checkpoint-every N: every N optimizer steps, a checkpoint of parameters and optimizer "
                 "state into DIR/step-NNNNNNNN, written in the background while training goes on")
      ->type_name("DIR");
  add_number<std::int64_t>(app, "--checkpoint-every", s.checkpoint_every, 1, "optimizer steps between checkpoints");
  app.add_flag("--elastic", s.elastic,
               "an elastic job (under tutti-run --elastic): a lost rank does not end training, the others go "
               "back to the last commit and on; ranks that join come in at the next commit");
  add_number<std::int64_t>(app, "--commit-every", s.commit_every, 1,
                           "with --elastic: optimizer steps between commits (default 20; epochs end with one)");
  app.add_flag("--checkpoint-blocking", s.checkpoint_blocking, "write each checkpoint before training goes on");
  app.add_option("--resume", s.resume,
                 "go on from the latest complete checkpoint in DIR (epoch, step, parameters, optimizer state); "
                 "none there: start afresh")
      ->type_name("DIR");
  add_number(app, "--width", s.width, 1, "channels and hidden units times W (default 1: 16, 32, 128)");
  add_number(app, "--pipeline", s.pipeline, 1, "N pipeline stages (1 to 4: conv1 | conv2 | fc1 | fc2 split evenly)");
  add_number(app, "--micro-batches", s.micro_batches, 1, "micro-batches per step, M divides --batch-size (default 1)");
  app.add_option_function<std::string>(
         "--schedule",
         [&s](const std::string& text) {
           s.schedule = text;
           if (!tutti::libtorch::pipeline_schedule_from_name(s.schedule))
             throw UsageError("--schedule takes gpipe or 1f1b, not '" + s.schedule + "'");
         },
         "gpipe (all forwards, then all backwards) or 1f1b (default)")
      ->type_name("S");
  add_number(app, "--tensor-parallel", s.tensor_parallel, 1,
             "fc1 split by columns and fc2 by rows over T ranks (T divides 128W); ranks: data x pipeline x "
             "tensor, tensor fastest; data = P / (N T)");
  app.add_option_function<std::string>(
         "--zero",
         [&s](const std::string& text) {
           s.zero = number<int>("--zero", text);
           if (s.zero != 1 && s.zero != 2) throw UsageError("--zero takes 1 or 2");
         },
         "ZeRO stage 1 (optimizer state sharded over the data-parallel ranks) or 2 (and gradients)")
      ->type_name("S");
  tools::add_size(app, "--device-memory", s.device_memory,
                  "train within this much emulated device memory (a plain number counts MiB), swapping "
                  "activations and optimizer state to host memory (--no-swap: an error instead)",
                  std::size_t{1} << 20);
  app.add_flag(
      "--no-swap", [&s](std::int64_t) { s.swap = false; }, "over the --device-memory budget is an error");
}

}  // namespace

Settings parse_settings(int argc, char** argv) {
  Settings s;
  CLI::App app(
      "Trains a small CNN on Fashion-MNIST over the ranks of the job (run it under tutti-run -n P, mpirun or srun; "
      "alone, it is one rank): data parallel, or a grid of data x pipeline x tensor parallel ranks; and reports "
      "per epoch the loss, the test accuracy, the throughput and how much of the allreduce time backward hid.",
      "tutti-train");
  tools::configure(app);
  add_run_flags(app, s);
  add_layout_flags(app, s);
  app.footer("Sizes: bytes, or a whole number with K, M, G, KiB, MiB or GiB (powers of 1024, any case).");
  try {
    if (!tools::parse(app, argc, argv)) {
      s.help = true;
      return s;
    }
  } catch (const tools::UsageError& e) {
    throw UsageError(e.what());
  }
  if (app.count("--device-memory") > 0 && s.device_memory == 0) throw UsageError("--device-memory must be at least 1");
  if (!(s.lr > 0)) throw UsageError("--lr must be positive");
  check_checkpoint_settings(s);
  check_parallel_settings(s);
  check_elastic_settings(s);
  return s;
}

}  // namespace tutti::train
