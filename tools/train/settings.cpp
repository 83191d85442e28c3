#include "settings.hpp"

#include <charconv>
#include <cmath>
#include <string_view>
#include <system_error>

#include "tutti/compress.hpp"
#include "tutti/torch_pipeline.hpp"

namespace tutti::train {

namespace {

template <class T>
T number(std::string_view flag, std::string_view text) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    throw UsageError(std::string(flag) + " needs a number, not '" + std::string(text) + "'");
  return value;
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

// The codecs with per-tensor state (error feedback, PowerSGD's Q) keep it outside the optimizer,
// where a checkpoint does not reach: a resumed run would not continue the same training.
void check_checkpoint_settings(const Settings& s) {
  if (s.checkpoint_dir.empty() != (s.checkpoint_every == 0))
    throw UsageError("--checkpoint DIR and --checkpoint-every N go together");
  if (s.checkpoint_blocking && s.checkpoint_dir.empty()) throw UsageError("--checkpoint-blocking needs --checkpoint");
  const auto kind = tutti::compress::Compression::parse(s.compression).kind;
  using Kind = tutti::compress::Compression::Kind;
  if ((!s.checkpoint_dir.empty() || !s.resume.empty()) && kind != Kind::none && kind != Kind::fp16 &&
      kind != Kind::bf16)
    throw UsageError("--checkpoint and --resume take --compression none, fp16 or bf16 (" + s.compression +
                     " keeps state a checkpoint does not hold)");
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

std::string usage() {
  return "usage: tutti-train [--epochs N] [--batch-size B] [--lr X] [--threads T] [--seed S] [--no-overlap]\n"
         "                   [--timeline FILE] [--fusion-threshold BYTES] [--backward-passes N]\n"
         "                   [--train-samples N] [--test-samples N] [--data DIR] [--compression C]\n"
         "                   [--profile FILE] [--straggler RANK:FACTOR]\n"
         "                   [--checkpoint DIR --checkpoint-every N [--checkpoint-blocking]] [--resume DIR]\n"
         "                   [--width W] [--pipeline N [--micro-batches M] [--schedule gpipe|1f1b]]\n"
         "                   [--tensor-parallel T] [--zero 1|2] [--device-memory MB [--no-swap]] [--loss-log FILE]\n"
         "                   [--log-interval N] [--no-progress]\n"
         "Trains a small CNN on Fashion-MNIST over the ranks of the job (run it under tutti-run -n P,\n"
         "mpirun or srun; alone, it is one rank): data parallel, or a grid of data x pipeline x tensor\n"
         "parallel ranks; and reports per epoch the loss, the test accuracy, the throughput and how much\n"
         "of the allreduce time backward hid.\n"
         "  --epochs N              epochs (default 2)\n"
         "  --batch-size B          samples per rank per step (default 64)\n"
         "  --lr X                  SGD learning rate, momentum 0.9 (default 0.05)\n"
         "  --threads T             torch threads per rank (default 1)\n"
         "  --seed S                initialization and shuffling seed (default 42)\n"
         "  --no-overlap            reduce all gradients after backward instead of during it\n"
         "  --timeline FILE         write the engine's Chrome trace to FILE\n"
         "  --fusion-threshold B    largest fused allreduce in bytes (default TUTTI_FUSION_THRESHOLD or 64 MiB)\n"
         "  --backward-passes N     backward passes accumulated per optimizer step (default 1)\n"
         "  --train-samples N       use the first N training samples (default 0: all 60000)\n"
         "  --test-samples N        evaluate on the first N test samples (default 0: all 10000)\n"
         "  --data DIR              the Fashion-MNIST files (default " +
         std::string(default_fashion_mnist_dir) +
         ")\n"
         "  --compression C         how gradients travel: none (default), fp16, bf16, qsgd:BITS (4 or 8),\n"
         "                          powersgd:RANK or topk:RATIO[:WARMUP] (0 < RATIO <= 1; over the first\n"
         "                          WARMUP steps the share sent falls from all to RATIO); qsgd and topk with\n"
         "                          error feedback; all but fp16 and bf16 are reduced after backward\n"
         "  --profile FILE          write the run's model profile (forward, each gradient's backward\n"
         "                          segment, optimizer; means after warm-up) to FILE, by rank 0, or by\n"
         "                          every rank when FILE holds {rank}\n"
         "  --straggler RANK:F      RANK's compute (forward, each backward segment, optimizer) takes F >= 1\n"
         "                          times as long: it sleeps (F-1) times each segment after it\n"
         "  --checkpoint DIR        with --checkpoint-every N: every N optimizer steps, a checkpoint of\n"
         "                          parameters and optimizer state into DIR/step-NNNNNNNN, written in the\n"
         "                          background while training goes on (--checkpoint-blocking: before)\n"
         "  --resume DIR            go on from the latest complete checkpoint in DIR (epoch, step,\n"
         "                          parameters, optimizer state); none there: start afresh\n"
         "  --width W               channels and hidden units times W (default 1: 16, 32, 128)\n"
         "  --pipeline N            N pipeline stages (1 to 4: conv1 | conv2 | fc1 | fc2 split evenly)\n"
         "  --micro-batches M       micro-batches per step, M divides --batch-size (default 1)\n"
         "  --schedule S            gpipe (all forwards, then all backwards) or 1f1b (default)\n"
         "  --tensor-parallel T     fc1 split by columns and fc2 by rows over T ranks (T divides 128W)\n"
         "                          ranks: data x pipeline x tensor, tensor fastest; data = P / (N T)\n"
         "  --zero S                ZeRO stage 1 (optimizer state sharded over the data-parallel ranks)\n"
         "                          or 2 (and gradients)\n"
         "  --device-memory MB      train within MB of emulated device memory, swapping activations and\n"
         "                          optimizer state to host memory (--no-swap: an error instead)\n"
         "  --loss-log FILE         rank 0 writes each step's loss over the global batch to FILE\n"
         "  --log-interval N        rank 0 prints a line every N steps of an epoch (step, loss of its\n"
         "                          own batch, samples/s so far, ETA of the epoch); default 0: none\n"
         "  --no-progress           no progress line (on a terminal, rank 0 shows one within each epoch)\n";
}

Settings parse_settings(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) throw UsageError(std::string(flag) + " needs a value");
      return argv[++i];
    };
    if (flag == "--epochs")
      s.epochs = at_least(flag, number<int>(flag, value()), 1);
    else if (flag == "--batch-size")
      s.batch_size = at_least<std::int64_t>(flag, number<std::int64_t>(flag, value()), 1);
    else if (flag == "--lr")
      s.lr = number<double>(flag, value());
    else if (flag == "--threads")
      s.threads = at_least(flag, number<int>(flag, value()), 1);
    else if (flag == "--seed")
      s.seed = number<std::uint64_t>(flag, value());
    else if (flag == "--no-overlap")
      s.overlap = false;
    else if (flag == "--timeline")
      s.timeline = value();
    else if (flag == "--fusion-threshold")
      s.fusion_threshold = number<std::size_t>(flag, value());
    else if (flag == "--backward-passes")
      s.backward_passes = at_least(flag, number<int>(flag, value()), 1);
    else if (flag == "--train-samples")
      s.train_samples = number<std::size_t>(flag, value());
    else if (flag == "--test-samples")
      s.test_samples = number<std::size_t>(flag, value());
    else if (flag == "--data")
      s.data = value();
    else if (flag == "--compression") {
      s.compression = value();
      try {
        tutti::compress::Compression::parse(s.compression);
      } catch (const tutti::Error& e) {
        throw UsageError(std::string("--compression: ") + e.what());
      }
    } else if (flag == "--profile")
      s.profile = value();
    else if (flag == "--straggler")
      s.straggler = straggler(flag, value());
    else if (flag == "--checkpoint")
      s.checkpoint_dir = value();
    else if (flag == "--checkpoint-every")
      s.checkpoint_every = at_least<std::int64_t>(flag, number<std::int64_t>(flag, value()), 1);
    else if (flag == "--checkpoint-blocking")
      s.checkpoint_blocking = true;
    else if (flag == "--resume")
      s.resume = value();
    else if (flag == "--width")
      s.width = at_least(flag, number<int>(flag, value()), 1);
    else if (flag == "--pipeline")
      s.pipeline = at_least(flag, number<int>(flag, value()), 1);
    else if (flag == "--micro-batches")
      s.micro_batches = at_least(flag, number<int>(flag, value()), 1);
    else if (flag == "--schedule") {
      s.schedule = value();
      if (!tutti::torch::pipeline_schedule_from_name(s.schedule))
        throw UsageError("--schedule takes gpipe or 1f1b, not '" + s.schedule + "'");
    } else if (flag == "--tensor-parallel")
      s.tensor_parallel = at_least(flag, number<int>(flag, value()), 1);
    else if (flag == "--zero") {
      s.zero = number<int>(flag, value());
      if (s.zero != 1 && s.zero != 2) throw UsageError("--zero takes 1 or 2");
    } else if (flag == "--device-memory")
      s.device_memory = at_least<std::size_t>(flag, number<std::size_t>(flag, value()), 1) << 20;
    else if (flag == "--no-swap")
      s.swap = false;
    else if (flag == "--loss-log")
      s.loss_log = value();
    else if (flag == "--log-interval")
      s.log_interval = at_least<std::int64_t>(flag, number<std::int64_t>(flag, value()), 0);
    else if (flag == "--no-progress")
      s.progress = false;
    else if (flag == "-h" || flag == "--help")
      s.help = true;
    else
      throw UsageError("unknown argument " + std::string(flag));
  }
  if (!(s.lr > 0)) throw UsageError("--lr must be positive");
  check_checkpoint_settings(s);
  check_parallel_settings(s);
  return s;
}

}  // namespace tutti::train
