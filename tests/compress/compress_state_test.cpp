// GradientCompressor::save_state and load_state: a compressor restored from a saved state goes on
// bit for bit as the one that never stopped; a rank that joins (no local state) starts its
// residuals from zero; bytes of another compression or damaged bytes are refused, changing nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "compress_data.hpp"
#include "threads.hpp"
#include "tutti/compress.hpp"

namespace tc = tutti::compress;
using tutti::testing::on_threads;
using tutti::testing::random_vector;
using tutti::testing::same_bits;

namespace {

const std::vector<std::int64_t> w_shape = {20, 3, 4}, b_shape = {20};

// One step of a two-tensor model on `rank`: its gradients (a function of rank and step), averaged.
std::vector<float> train_step(tc::GradientCompressor& c, tutti::Communicator& comm, int rank, int step) {
  auto w = random_vector(240, static_cast<unsigned>(rank * 100 + step));
  auto b = random_vector(20, static_cast<unsigned>(rank * 100 + step + 50));
  c.average(comm, "w", w.data(), w_shape);
  c.average(comm, "b", b.data(), b_shape);
  c.next_step();
  w.insert(w.end(), b.begin(), b.end());
  return w;
}

constexpr int state_ranks = 2, steps_before = 3, steps_after = 3;

// Steps steps_before.. of every rank (steps_after of them), by a compressor that ran the first
// steps_before and then, if `reload`, was replaced by a fresh one loading its state (`local`: with the rank's own
// part).
std::vector<std::vector<float>> later_steps(const char* text, bool reload, bool local) {
  auto comms = tutti::local_group(state_ranks);
  std::vector<std::vector<float>> out(state_ranks);
  const auto failures = on_threads(state_ranks, [&](int r) {
    tc::GradientCompressor a(tc::Compression::parse(text), 9);
    for (int s = 0; s < steps_before; ++s) train_step(a, comms[r], r, s);
    tc::GradientCompressor b(tc::Compression::parse(text), 9);
    tc::GradientCompressor* c = &a;
    if (reload) {
      const auto state = a.save_state();
      b.load_state(state.shared, local ? std::span<const std::byte>(state.local) : std::span<const std::byte>());
      EXPECT_EQ(b.step(), static_cast<std::uint64_t>(steps_before));
      c = &b;
    }
    for (int s = steps_before; s < steps_before + steps_after; ++s) {
      const auto v = train_step(*c, comms[r], r, s);
      out[static_cast<std::size_t>(r)].insert(out[static_cast<std::size_t>(r)].end(), v.begin(), v.end());
    }
  });
  EXPECT_EQ(failures, "");
  return out;
}

}  // namespace

TEST(CompressorState, RestoredGoesOnBitForBit) {
  for (const char* text : {"qsgd:8", "qsgd:4", "topk:0.1:4", "powersgd:2", "fp16"}) {
    const auto straight = later_steps(text, false, false);
    const auto restored = later_steps(text, true, true);
    for (int r = 0; r < state_ranks; ++r) EXPECT_TRUE(same_bits(straight[r], restored[r])) << text << " rank " << r;
  }
}

// Without the local part the residuals start from zero: the steps differ from the uninterrupted
// run (what was not sent is lost), yet every rank still gets the same bits.
TEST(CompressorState, WithoutTheLocalPartResidualsStartFromZero) {
  for (const char* text : {"qsgd:8", "topk:0.1", "powersgd:2"}) {
    const auto straight = later_steps(text, false, false);
    const auto joined = later_steps(text, true, false);
    EXPECT_FALSE(same_bits(straight[0], joined[0])) << text;
    EXPECT_TRUE(same_bits(joined[0], joined[1])) << text;
  }
  const auto failures = on_threads(1, [&](int) {
    auto comm = tutti::local_group(1)[0];
    tc::GradientCompressor a(tc::Compression::parse("qsgd:8"), 1);
    train_step(a, comm, 0, 0);
    ASSERT_EQ(a.residual_count(), 2u);
    tc::GradientCompressor b(tc::Compression::parse("qsgd:8"), 1);
    b.load_state(a.save_state().shared, {});
    EXPECT_EQ(b.residual_count(), 0u);
    EXPECT_EQ(b.step(), 1u);
  });
  EXPECT_EQ(failures, "");
}

TEST(CompressorState, RefusesAnotherCompressionOrDamageChangingNothing) {
  const auto failures = on_threads(1, [&](int) {
    auto comm = tutti::local_group(1)[0];
    tc::GradientCompressor q(tc::Compression::parse("qsgd:8"), 1), s(tc::Compression::parse("powersgd:1"), 1);
    train_step(q, comm, 0, 0);
    train_step(s, comm, 0, 0);
    const auto qs = q.save_state(), ss = s.save_state();
    auto refused = [&](tc::GradientCompressor& c, std::span<const std::byte> shared, std::span<const std::byte> local,
                       const char* why) {
      const auto before = c.save_state();
      try {
        c.load_state(shared, local);
        ADD_FAILURE() << "accepted: " << why;
      } catch (const tutti::Error& e) {
        EXPECT_EQ(e.code(), tutti::ErrorCode::invalid_argument) << why;
        EXPECT_NE(std::string(e.what()).find("load_state"), std::string::npos) << e.what();
      }
      const auto after = c.save_state();
      EXPECT_EQ(before.shared, after.shared) << why;
      EXPECT_EQ(before.local, after.local) << why;
    };
    refused(q, ss.shared, {}, "powersgd's state in qsgd");
    refused(s, qs.shared, qs.local, "qsgd's state in powersgd");
    refused(q, std::span(qs.shared).first(qs.shared.size() - 1), qs.local, "a shared part cut short");
    refused(q, qs.shared, std::span(qs.local).first(qs.local.size() - 3), "a local part cut short");
    auto longer = qs.local;
    longer.push_back(std::byte{0});
    refused(q, qs.shared, longer, "a byte past the end");
    auto huge = ss.shared;  // the first tensor's name length, as 2^63
    huge[4 + 8 + std::string("powersgd:1").size() + 8 + 8 + 7] = std::byte{0x80};
    refused(s, huge, {}, "a name longer than the bytes");
    refused(s, ss.shared, qs.local, "qsgd's residuals in powersgd");
    refused(q, {}, {}, "nothing");
  });
  EXPECT_EQ(failures, "");
}
