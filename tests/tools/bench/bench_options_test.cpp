// tutti-bench's command line (tools/bench/options.hpp): nccl-tests' short flags, --opt=value, the
// size syntax, --config, and what it refuses, each checked against the options it yields.
#include <gtest/gtest.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/options.hpp"
#include "tool_options_test.hpp"

namespace {

using tutti::Algorithm;
using tutti::Collective;
using tutti::DataType;
using tutti::ReduceOp;
using tutti::bench::BenchOptions;
using tutti::bench::Kind;

BenchOptions parse(std::vector<std::string> args) {
  return tutti::testing::parsed("tutti-bench", std::move(args), tutti::bench::parse_options);
}

std::string refusal(std::vector<std::string> args) {
  return tutti::testing::refusal<std::invalid_argument>("tutti-bench", std::move(args), tutti::bench::parse_options);
}

TEST(BenchOptions, Defaults) {
  const BenchOptions o = parse({});
  EXPECT_EQ(o.kinds, std::vector<Kind>{Collective::allreduce});
  EXPECT_FALSE(o.kinds_given);
  EXPECT_EQ(o.min_bytes, 8u);
  EXPECT_EQ(o.max_bytes, std::size_t{64} << 20);
  EXPECT_EQ(o.factor, 2.0);
  EXPECT_EQ(o.iterations, std::nullopt);
  EXPECT_EQ(o.warmup, 5);
  EXPECT_EQ(o.types, std::vector<DataType>{DataType::f32});
  EXPECT_EQ(o.ops, std::vector<ReduceOp>{ReduceOp::sum});
  EXPECT_EQ(o.root, 0);
  EXPECT_TRUE(o.check);
  EXPECT_EQ(o.algorithm, Algorithm::automatic);
  EXPECT_FALSE(o.per_call);
  EXPECT_EQ(o.command_line, "tutti-bench");
  EXPECT_TRUE(parse({"--per-call"}).per_call);
}

TEST(BenchOptions, NcclTestsShortFlags) {
  const BenchOptions o = parse(
      {"-b", "64K", "-e", "8M", "-f", "4", "-n", "3", "-w", "2", "-d", "i32,f64", "-o", "max", "-r", "1", "-c", "0"});
  EXPECT_EQ(o.min_bytes, 65536u);
  EXPECT_EQ(o.max_bytes, 8u << 20);
  EXPECT_EQ(o.factor, 4.0);
  EXPECT_EQ(o.iterations, 3);
  EXPECT_EQ(o.warmup, 2);
  EXPECT_EQ(o.types, (std::vector<DataType>{DataType::i32, DataType::f64}));
  EXPECT_EQ(o.ops, std::vector<ReduceOp>{ReduceOp::max});
  EXPECT_EQ(o.root, 1);
  EXPECT_FALSE(o.check);
  EXPECT_EQ(tutti::bench::sweep_sizes(o), (std::vector<std::size_t>{65536, 262144, 1048576, 4194304}));
}

TEST(BenchOptions, LongFlagsWithEquals) {
  const BenchOptions o = parse({"--collective=broadcast,sendrecv", "--minbytes=1KiB", "--maxbytes=2MiB",
                                "--stepfactor=8", "--iters=7", "--warmup_iters=0", "--datatype=bf16", "--op=min",
                                "--root=2", "--check=1", "--algorithm=ring", "--json=out.json", "--peers=gloo,mpi"});
  EXPECT_EQ(o.kinds, (std::vector<Kind>{Collective::broadcast, tutti::bench::sendrecv}));
  EXPECT_TRUE(o.kinds_given);
  EXPECT_EQ(o.min_bytes, 1024u);
  EXPECT_EQ(o.max_bytes, 2u << 20);
  EXPECT_EQ(o.factor, 8.0);
  EXPECT_EQ(o.iterations, 7);
  EXPECT_EQ(o.warmup, 0);
  EXPECT_EQ(o.types, std::vector<DataType>{DataType::bf16});
  EXPECT_EQ(o.ops, std::vector<ReduceOp>{ReduceOp::min});
  EXPECT_EQ(o.root, 2);
  EXPECT_TRUE(o.check);
  EXPECT_EQ(o.algorithm, Algorithm::ring);
  EXPECT_EQ(o.json_path, "out.json");
  EXPECT_EQ(o.peers, (std::vector<std::string>{"gloo", "mpi"}));
}

TEST(BenchOptions, EverySizeFlagTakesTheSizeSyntax) {
  const BenchOptions o = parse({"-b", "1k", "-e", "1gib", "--collective", "allreduce"});
  EXPECT_EQ(o.min_bytes, 1024u);
  EXPECT_EQ(o.max_bytes, 1u << 30);
  const BenchOptions sparse = parse({"--collective", "sparse_allreduce", "--dim", "64KiB", "--density", "0.5,1"});
  EXPECT_TRUE(sparse.sparse);
  EXPECT_EQ(sparse.sparse_dim, 65536u);
  EXPECT_EQ(sparse.densities, (std::vector<double>{0.5, 1.0}));
  const std::string expected = ": expected a size (bytes, or a whole number with K, M, G, KiB, MiB or GiB), got '";
  EXPECT_EQ(refusal({"-b", "1.5K"}), "--minbytes" + expected + "1.5K'");
  EXPECT_EQ(refusal({"--maxbytes=64KB"}), "--maxbytes" + expected + "64KB'");
  EXPECT_EQ(refusal({"-b", "-1"}), "--minbytes" + expected + "-1'");
  EXPECT_EQ(refusal({"--collective", "sparse_allreduce", "--dim", "1T"}), "--dim" + expected + "1T'");
  EXPECT_EQ(refusal({"-e", "17179869184G"}),
            "--maxbytes: '17179869184G' is too large (at most 18446744073709551615 bytes)");
  EXPECT_EQ(refusal({"-b", "18446744073709551616"}),
            "--minbytes: '18446744073709551616' is too large (at most 18446744073709551615 bytes)");
}

TEST(BenchOptions, OIsTheOpAndOutputHasNoLetter) {
  const BenchOptions o = parse({"--tune", "-o", "avg", "--output", "tuning.json"});
  EXPECT_TRUE(o.tune);
  EXPECT_EQ(o.ops, std::vector<ReduceOp>{ReduceOp::avg});
  EXPECT_EQ(o.output_path, "tuning.json");
  EXPECT_EQ(parse({"--calibrate", "--output=t.json"}).output_path, "t.json");
  EXPECT_EQ(refusal({"--calibrate", "-o", "t.json"}), "-o/--op: unknown op 't.json' (sum, prod, min, max, avg, all)");
}

TEST(BenchOptions, ShortFlagsNcclTestsMeansOtherwiseAreGone) {
  EXPECT_EQ(refusal({"-t", "all"}), "unknown option -t (use --collective)");
  EXPECT_EQ(refusal({"-a", "ring"}), "unknown option -a (use --algorithm)");
  EXPECT_EQ(refusal({"--frobnicate"}), "unknown option --frobnicate (see --help)");
}

TEST(BenchOptions, ConfigFileAndTheCommandLineOverIt) {
  tutti::testing::TempFile file("bench.toml",
                                "collective = \"allreduce,allgather\"\nminbytes = \"1K\"\nmaxbytes = 4096\n"
                                "iters = 3\ndatatype = \"i32\"\nop = \"max\"\nno-progress = true\n");
  const BenchOptions o = parse({"--config", file.path()});
  EXPECT_EQ(o.kinds, (std::vector<Kind>{Collective::allreduce, Collective::allgather}));
  EXPECT_EQ(o.min_bytes, 1024u);
  EXPECT_EQ(o.max_bytes, 4096u);
  EXPECT_EQ(o.iterations, 3);
  EXPECT_EQ(o.types, std::vector<DataType>{DataType::i32});
  EXPECT_EQ(o.ops, std::vector<ReduceOp>{ReduceOp::max});
  EXPECT_TRUE(o.quiet_progress);
  const BenchOptions over = parse({"--config=" + file.path(), "-b", "2K", "--iters=9", "-o", "min"});
  EXPECT_EQ(over.min_bytes, 2048u);
  EXPECT_EQ(over.iterations, 9);
  EXPECT_EQ(over.ops, std::vector<ReduceOp>{ReduceOp::min});
  EXPECT_EQ(over.max_bytes, 4096u);  // from the file
  tutti::testing::TempFile bad("bench_bad.toml", "minbytes = 1\nthreads = 4\n");
  EXPECT_EQ(refusal({"--config", bad.path()}), "--config: unknown key 'threads'");
}

TEST(BenchOptions, WhatTheHandParserRefusedIsStillRefused) {
  EXPECT_EQ(refusal({"-b", "1M", "-e", "1K"}), "-b/--minbytes must not exceed -e/--maxbytes");
  EXPECT_EQ(refusal({"-n", "0"}), "-n/--iters must be at least 1");
  EXPECT_EQ(refusal({"-n", "0x10"}), "--iters: expected an integer, got '0x10'");
  EXPECT_EQ(refusal({"-f", "1.5"}), "--stepfactor: expected an integer, got '1.5'");
  EXPECT_EQ(refusal({"-f", "1", "-b", "8", "-e", "16"}), "-f/--stepfactor must be greater than 1");
  EXPECT_EQ(refusal({"-w", "-1"}), "-w/--warmup_iters must not be negative");
  EXPECT_EQ(refusal({"-r", "-1"}), "-r/--root must not be negative");
  EXPECT_EQ(refusal({"-d", "float17"}), "-d/--datatype: unknown type 'float17'");
  EXPECT_EQ(refusal({"--collective", "allsum"}), "--collective: unknown collective 'allsum'");
  EXPECT_EQ(refusal({"--algorithm", "bogo"}), "--algorithm: unknown algorithm 'bogo'");
  EXPECT_EQ(refusal({"--peers", "nccl"}), "--peers: unknown peer 'nccl' (mpi, gloo; sync with --device)");
  EXPECT_EQ(refusal({"-b"}), "--minbytes: 1 required SIZE missing");
  EXPECT_EQ(refusal({"--collective", "sparse_allreduce", "--density", "2"}), "--density: each must be in (0, 1]");
  EXPECT_EQ(refusal({"--collective", "sparse_allreduce", "--density", "x"}), "--density: expected a number, got 'x'");
  EXPECT_EQ(refusal({"--collective", "allreduce", "--density", "0.1"}),
            "--density: only with --collective sparse_allreduce");
  EXPECT_EQ(refusal({"--device", "emulated", "--algorithm", "ring"}),
            "--algorithm/--all-algorithms: host mode only (with --device, choose a --backend)");
}

// --kernels times element-wise kernels: avg (a sum, divided once) is refused, and -o all means the
// four element-wise ops.
TEST(BenchOptions, KernelsTakeTheElementWiseOps) {
  EXPECT_EQ(refusal({"--device", "emulated", "--kernels", "-o", "avg"}),
            "--kernels: no avg (an average is a sum divided once: time -o sum)");
  EXPECT_EQ(parse({"--device", "emulated", "--kernels", "-o", "all"}).ops,
            (std::vector<ReduceOp>{ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max}));
  EXPECT_EQ(parse({"--device", "emulated", "-o", "all"}).ops,
            (std::vector<ReduceOp>{ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg}));
}

TEST(BenchOptions, HelpReturnsNothing) {
  ::testing::internal::CaptureStdout();
  tutti::testing::Argv a("tutti-bench", {"-h"});
  EXPECT_FALSE(tutti::bench::parse_options(a.argc(), a.argv()).has_value());
  const std::string help = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(help.find("-b,--minbytes SIZE"), std::string::npos) << help;
  EXPECT_NE(help.find("--collective TEXT"), std::string::npos) << help;
}

}  // namespace
