// What every transport must do alike, as cases run through the transport::Transport interface.
// Each case is one rank's part: it is called on every rank of a fresh group (threads of one
// process, or MPI processes) and returns that rank's failures as text ("" when all held). Every
// wait is bounded, so a transport that loses a message fails the case instead of hanging it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "transport/matching.hpp"
#include "transport/transport.hpp"

namespace tutti::testing::conformance {

using namespace std::chrono_literals;
using transport::Channel;
using transport::Completion;
using transport::MessageKey;
using transport::Transport;
using Clock = std::chrono::steady_clock;

/// What a transport cannot do by design, which the cases then do not ask of it.
struct Traits {
  bool sender_learns_size_mismatch = true;  // MPI: the sender's MPI_Isend completes normally
  bool knows_oversized_size = true;         // MPI: a longer message only reports truncation
  bool checks_announced_signatures = true;  // MPI: announce keeps no record (the executor checks)
  bool refuses_before_writing = true;       // MPI: a receive of the wrong size has written what fit
  bool splits_alike = true;                 // routed: a split within one host is shm, one rank per host tcp
  std::size_t eager_bytes = 0;  // shm, tcp: a send up to this size completes unmatched; its sender learns no mismatch
};

inline constexpr auto case_limit = 30s;

/// A rank's failed checks.
class Checks {
 public:
  void operator()(bool ok, const std::string& what) {
    if (!ok) text_ += what + "\n";
  }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

/// Progresses `t` until none of `ops` is posted; false when `limit` passed first.
inline bool await(Transport& t, const std::vector<Completion*>& ops, std::chrono::milliseconds limit = case_limit) {
  const auto deadline = Clock::now() + limit;
  const auto pending = [&] {
    return std::any_of(ops.begin(), ops.end(), [](const Completion* c) { return c->state() == Completion::posted; });
  };
  while (pending()) {
    const std::uint64_t seen = t.generation();
    t.progress();
    if (!pending()) break;
    const auto now = Clock::now();
    if (now >= deadline) return false;
    t.wait(seen, std::min(deadline, now + 20ms));
  }
  return true;
}

/// Withdraws whatever of `ops` is still posted (a failed case must not leave buffers in use).
inline void withdraw(Transport& t, const std::vector<Completion*>& ops) {
  for (Completion* c : ops)
    if (c->state() == Completion::posted) t.cancel(c);
}

/// Byte i of the message `from` sends `to` under `tag`.
inline std::byte pattern(int from, int to, std::uint64_t tag, std::size_t i) {
  return static_cast<std::byte>((static_cast<std::size_t>(from) * 131 + static_cast<std::size_t>(to) * 31 +
                                 static_cast<std::size_t>(tag) * 7 + i) %
                                251);
}

inline std::vector<std::byte> message(int from, int to, std::uint64_t tag, std::size_t bytes) {
  std::vector<std::byte> out(bytes);
  for (std::size_t i = 0; i < bytes; ++i) out[i] = pattern(from, to, tag, i);
  return out;
}

inline constexpr std::byte poison{0xA5};

/// Whether `in` holds exactly the message and then the poisoned guard byte; "" or what differs.
inline std::string differs(const std::vector<std::byte>& in, int from, int to, std::uint64_t tag, std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; ++i)
    if (in[i] != pattern(from, to, tag, i))
      return "byte " + std::to_string(i) + " of " + std::to_string(bytes) + " from rank " + std::to_string(from) +
             " (tag " + std::to_string(tag) + ") is wrong";
  if (in[bytes] != poison) return "wrote past the end of a " + std::to_string(bytes) + "-byte message";
  return {};
}

/// A collective's signature, differing only by count (kind and algorithm left as they default).
inline transport::Signature signature(std::uint64_t seq, std::size_t count) {
  transport::Signature s;
  s.seq = seq;
  s.count = count;
  s.type = DataType::f32;
  s.op = ReduceOp::sum;
  return s;
}

/// One posted message of a case: its buffer and its completion.
struct Posted {
  explicit Posted(std::vector<std::byte> bytes) : data(std::move(bytes)) {}
  std::vector<std::byte> data;
  Completion done;
};

/// Every rank sends every rank (itself included) messages of 0, 1, 4099 and 3 MiB + 7 bytes, both
/// directions at once; half of them are posted before their receive, half after. Checks every byte.
inline std::string exchange_exact_bytes(Transport& t) {
  Checks check;
  const int p = t.size(), me = t.rank();
  const std::size_t sizes[] = {0, 1, 4099, (std::size_t{3} << 20) + 7};
  std::vector<std::unique_ptr<Posted>> sends, recvs;
  std::vector<Completion*> all;
  for (std::uint64_t s = 0; s < std::size(sizes); ++s) {
    const std::uint64_t tag = 100 + s;
    const auto post_sends = [&] {
      for (int q = 0; q < p; ++q) {
        auto& out = *sends.emplace_back(std::make_unique<Posted>(message(me, q, tag, sizes[s])));
        t.post_send(q, MessageKey{Channel::point_to_point, tag, 0}, out.data.data(), sizes[s], &out.done);
        all.push_back(&out.done);
      }
    };
    if (s % 2 == 0) post_sends();
    for (int q = 0; q < p; ++q) {
      auto& in = *recvs.emplace_back(std::make_unique<Posted>(std::vector<std::byte>(sizes[s] + 1, poison)));
      t.post_recv(q, MessageKey{Channel::point_to_point, tag, 0}, in.data.data(), sizes[s], &in.done);
      all.push_back(&in.done);
    }
    if (s % 2 == 1) post_sends();
  }
  check(await(t, all), "messages still pending at the deadline");
  for (std::size_t i = 0; i < recvs.size(); ++i) {
    const int from = static_cast<int>(i % static_cast<std::size_t>(p));
    const std::uint64_t s = i / static_cast<std::size_t>(p);
    check(recvs[i]->done.state() == Completion::done,
          "receive from rank " + std::to_string(from) + " did not complete: " + recvs[i]->done.error);
    if (recvs[i]->done.state() == Completion::done) {
      const std::string wrong = differs(recvs[i]->data, from, me, 100 + s, sizes[s]);
      check(wrong.empty(), wrong);
    }
  }
  for (const auto& send : sends) check(send->done.state() == Completion::done, "a send failed: " + send->done.error);
  withdraw(t, all);
  return check.text();
}

/// Many messages with distinct keys to the next rank, received in another order than sent: 24
/// of one collective (indices; some empty, some over 1 MiB) and 8 tags of point to point.
inline std::string match_out_of_order(Transport& t) {
  Checks check;
  const int p = t.size(), me = t.rank();
  const int right = (me + 1) % p, left = (me + p - 1) % p;
  constexpr std::uint64_t seq = 5;
  constexpr std::uint32_t n = 24;
  t.announce(signature(seq, 64));  // the same on every rank
  const auto bytes = [](std::uint32_t k) -> std::size_t {
    return k % 5 == 0 ? 0 : k == 7 ? (1u << 20) + 3 : k * 517 + 1;
  };
  // Collective messages carry (seq, index); point-to-point ones their tag (index 0).
  std::vector<std::pair<MessageKey, std::size_t>> keys;
  for (std::uint32_t k = 0; k < n; ++k) keys.emplace_back(MessageKey{Channel::collective, seq, k}, bytes(k));
  for (std::uint64_t tag = 0; tag < 8; ++tag)
    keys.emplace_back(MessageKey{Channel::point_to_point, 300 + tag, 0}, 1000 * tag + 1);
  const auto tag_of = [](const MessageKey& key) { return key.channel == Channel::collective ? key.index : key.seq; };
  std::vector<std::unique_ptr<Posted>> sends, recvs(keys.size());
  std::vector<Completion*> all;
  for (const auto& [key, size] : keys) {
    auto& out = *sends.emplace_back(std::make_unique<Posted>(message(me, right, tag_of(key), size)));
    t.post_send(right, key, out.data.data(), size, &out.done);
    all.push_back(&out.done);
  }
  // Receives in a permutation of the sending order (7 is prime to 32), the point-to-point ones
  // interleaved with the collective ones.
  for (std::size_t j = 0; j < keys.size(); ++j) {
    const std::size_t k = j * 7 % keys.size();
    recvs[k] = std::make_unique<Posted>(std::vector<std::byte>(keys[k].second + 1, poison));
    t.post_recv(left, keys[k].first, recvs[k]->data.data(), keys[k].second, &recvs[k]->done);
    all.push_back(&recvs[k]->done);
  }
  check(await(t, all), "messages still pending at the deadline");
  for (std::size_t k = 0; k < keys.size(); ++k) {
    check(recvs[k]->done.state() == Completion::done,
          "receive " + std::to_string(k) + " failed: " + recvs[k]->done.error);
    if (recvs[k]->done.state() != Completion::done) continue;
    const std::string wrong = differs(recvs[k]->data, left, me, tag_of(keys[k].first), keys[k].second);
    check(wrong.empty(), wrong);
  }
  for (const auto& send : sends) check(send->done.state() == Completion::done, "a send failed: " + send->done.error);
  withdraw(t, all);
  return check.text();
}

/// Three rounds of messages to the next rank, most of them in flight or arrived before their
/// receive is posted: sizes from 2 KiB to 1 MiB + 1, 9.8 MiB a round, rotated from round to
/// round so that a transport that keeps the buffers of early messages for the next serves a
/// message with a buffer larger than it. Checks every byte and the guard byte after each.
inline std::string early_messages_round_after_round(Transport& t) {
  Checks check;
  const int p = t.size(), me = t.rank();
  const int right = (me + 1) % p, left = (me + p - 1) % p;
  const std::size_t sizes[] = {65541,   307200,  1048576, 1048577, 204803,  2048, 921600,
                               1048576, 1048576, 1048576, 1048576, 1048576, 70000};
  constexpr std::size_t n = std::size(sizes);
  for (std::uint64_t round = 0; round < 3; ++round) {
    const std::uint64_t seq = 40 + round;
    t.announce(signature(seq, 64));
    const auto bytes = [&](std::size_t k) { return sizes[(k + round * 5) % n]; };
    std::vector<std::unique_ptr<Posted>> sends, recvs(n);
    std::vector<Completion*> all;
    for (std::uint32_t k = 0; k < n; ++k) {
      auto& out = *sends.emplace_back(std::make_unique<Posted>(message(me, right, seq * 100 + k, bytes(k))));
      t.post_send(right, MessageKey{Channel::collective, seq, k}, out.data.data(), bytes(k), &out.done);
      all.push_back(&out.done);
    }
    await(t, all, 50ms);  // let them arrive (a transport that cannot take them early just waits)
    for (std::size_t j = 0; j < n; ++j) {
      const auto k = static_cast<std::uint32_t>(j * 5 % n);
      recvs[k] = std::make_unique<Posted>(std::vector<std::byte>(bytes(k) + 1, poison));
      t.post_recv(left, MessageKey{Channel::collective, seq, k}, recvs[k]->data.data(), bytes(k), &recvs[k]->done);
      all.push_back(&recvs[k]->done);
    }
    check(await(t, all), "round " + std::to_string(round) + ": messages still pending at the deadline");
    for (std::uint32_t k = 0; k < n; ++k) {
      check(recvs[k]->done.state() == Completion::done,
            "round " + std::to_string(round) + ", receive " + std::to_string(k) + " failed: " + recvs[k]->done.error);
      if (recvs[k]->done.state() != Completion::done) continue;
      const std::string wrong = differs(recvs[k]->data, left, me, seq * 100 + k, bytes(k));
      check(wrong.empty(), "round " + std::to_string(round) + ": " + wrong);
    }
    withdraw(t, all);
  }
  return check.text();
}

/// Rank 0 sends rank 1 40 bytes where it expects 48, and rank 1 sends rank 0 48 where it expects
/// 40: each receive fails with the one text naming both ranks (and each send too, where the
/// transport tells the sender: not for an eager message); then one of the right size goes through.
inline std::string size_mismatch(Transport& t, const Traits& traits) {
  Checks check;
  const int me = t.rank();
  if (t.size() < 2 || me > 1) return {};
  const int other = 1 - me;
  const MessageKey short_key{Channel::point_to_point, 3, 0}, long_key{Channel::point_to_point, 4, 0};
  const std::size_t sent = me == 0 ? 40 : 48, expected = me == 0 ? 40 : 48;
  const MessageKey& mine = me == 0 ? short_key : long_key;    // the key of what this rank sends
  const MessageKey& theirs = me == 0 ? long_key : short_key;  // and of what it receives
  std::vector<std::byte> out(sent, std::byte{1}), in(64, poison);
  Completion send, recv;
  t.post_send(other, mine, out.data(), sent, &send);
  t.post_recv(other, theirs, in.data(), expected, &recv);
  check(await(t, {&send, &recv}), "size mismatch: still pending at the deadline");
  const std::size_t their_size = me == 0 ? 48 : 40;
  const std::optional<std::size_t> reported =
      their_size > expected && !traits.knows_oversized_size ? std::nullopt : std::optional(their_size);
  const std::string received_text = transport::size_mismatch(other, reported, me, expected, theirs);
  check(recv.state() == Completion::failed && recv.error == received_text,
        "receive: state " + std::to_string(recv.state()) + ", error '" + recv.error + "', expected '" + received_text +
            "'");
  if (traits.refuses_before_writing)
    check(std::all_of(in.begin(), in.end(), [](std::byte b) { return b == poison; }), "a refused message was written");
  const std::string sent_text = transport::size_mismatch(me, sent, other, 88 - sent, mine);
  if ((traits.sender_learns_size_mismatch && sent > traits.eager_bytes) || send.state() == Completion::failed)
    check(send.state() == Completion::failed && send.error == sent_text,
          "send: state " + std::to_string(send.state()) + ", error '" + send.error + "', expected '" + sent_text + "'");
  else
    check(send.state() == Completion::done, "send: state " + std::to_string(send.state()) + ": " + send.error);
  withdraw(t, {&send, &recv});
  // The transport goes on: the same pair, the right size.
  const MessageKey next{Channel::point_to_point, 5, 0};
  std::vector<std::byte> good = message(me, other, 5, 40), got(41, poison);
  Completion good_send, good_recv;
  t.post_send(other, next, good.data(), good.size(), &good_send);
  t.post_recv(other, next, got.data(), 40, &good_recv);
  check(await(t, {&good_send, &good_recv}), "the message after the mismatch is still pending");
  check(good_send.state() == Completion::done && good_recv.state() == Completion::done,
        "the message after the mismatch failed: " + good_send.error + good_recv.error);
  if (good_recv.state() == Completion::done) {
    const std::string wrong = differs(got, other, me, 5, 40);
    check(wrong.empty(), wrong);
  }
  withdraw(t, {&good_send, &good_recv});
  return check.text();
}

/// Progresses `t` until it is aborted, each wait sleeping up to `slice`; the failure, or nullopt
/// when `limit` passed first.
inline std::optional<transport::Failure> await_abort(Transport& t, std::chrono::milliseconds limit,
                                                     std::chrono::milliseconds slice = 20ms) {
  const auto deadline = Clock::now() + limit;
  for (;;) {
    const std::uint64_t seen = t.generation();
    t.progress();
    if (auto failure = t.aborted()) return failure;
    const auto now = Clock::now();
    if (now >= deadline) return std::nullopt;
    t.wait(seen, std::min(deadline, now + slice));
  }
}

/// Rank 1 announces collective #9 with count 99, every other rank with 100 (and, where announce
/// alone does not compare them, each sends its right neighbour a message of the collective): every
/// rank's communicator is aborted with Error(mismatch) naming rank 1 and a rank that called the
/// other collective, the lower rank first. Which other rank depends on who compared first: a
/// transport that compares neighbours names a neighbour, shm compares a publication with every
/// slot already published (rank 3 publishing last finds rank 1 before anyone else).
inline std::string collective_mismatch(Transport& t, const Traits& traits) {
  Checks check;
  const int p = t.size(), me = t.rank();
  if (p < 2 || !traits.checks_announced_signatures) return {};
  constexpr int odd = 1;
  constexpr std::uint64_t seq = 9;
  const auto called = [](int rank) { return signature(seq, rank == odd ? 99 : 100); };
  t.announce(called(me));
  const int right = (me + 1) % p, left = (me + p - 1) % p;
  std::vector<std::byte> out(8, std::byte{2}), in(8, poison);
  Completion send, recv;
  // As the executor does: nothing is posted for a collective whose announcement aborted.
  if (!t.detects_every_mismatch() && !t.aborted()) {
    t.post_send(right, MessageKey{Channel::collective, seq, 0}, out.data(), out.size(), &send);
    t.post_recv(left, MessageKey{Channel::collective, seq, 0}, in.data(), in.size(), &recv);
  }
  const auto failure = await_abort(t, case_limit);
  withdraw(t, {&send, &recv});
  if (!failure) return "collective mismatch: not aborted by the deadline\n";
  std::vector<std::string> allowed;
  for (int other = 0; other < p; ++other)
    if (other != odd) allowed.push_back(transport::collective_mismatch(odd, called(odd), other, called(other)).what());
  const std::string what = failure->error.what();
  check(failure->error.code() == ErrorCode::mismatch, "code " + std::string(to_string(failure->error.code())));
  check(
      std::find(allowed.begin(), allowed.end(), what) != allowed.end(),
      "text '" + what + "', expected one of the " + std::to_string(allowed.size()) + " like '" + allowed.front() + "'");
  check(failure->seq == seq, "failure of seq " + std::to_string(failure->seq));
  if ((me == odd) != (left == odd)) check(in[0] == poison, "a mismatched collective's message was written");
  return check.text();
}

/// Splits into the even and the odd ranks, each in reverse order: the sub-transport has the right
/// rank and size, and a ring of messages on it with the same keys as a ring on the parent at the
/// same time reaches only its own members.
inline std::string split_with(Transport& t, const Traits& traits) {
  Checks check;
  const int p = t.size(), me = t.rank();
  std::vector<int> members;
  for (int r = p - 1; r >= 0; --r)
    if (r % 2 == me % 2) members.push_back(r);
  const int sub_rank = static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
  const auto sub_size = static_cast<int>(members.size());
  const std::uint64_t id = 500 + static_cast<std::uint64_t>(me % 2);
  std::unique_ptr<Transport> sub = t.split(id, members, sub_rank);
  check(sub->rank() == sub_rank && sub->size() == sub_size,
        "split: rank " + std::to_string(sub->rank()) + " of " + std::to_string(sub->size()) + ", expected " +
            std::to_string(sub_rank) + " of " + std::to_string(sub_size));
  check(sub->id() == id, "split: id " + std::to_string(sub->id()));
  if (traits.splits_alike) check(sub->name() == t.name(), "split: another transport");
  // The same key on both; the content says which communicator (tag 1: parent, 2: sub) and who sent it.
  const MessageKey key{Channel::point_to_point, 1, 0};
  const std::size_t bytes = 70001;
  const int right = (me + 1) % p, left = (me + p - 1) % p;
  const int sub_right = (sub_rank + 1) % sub_size, sub_left = (sub_rank + sub_size - 1) % sub_size;
  std::vector<std::byte> out = message(me, right, 1, bytes), in(bytes + 1, poison);
  std::vector<std::byte> sub_out = message(sub_rank, sub_right, 2, bytes), sub_in(bytes + 1, poison);
  Completion send, recv, sub_send, sub_recv;
  sub->post_recv(sub_left, key, sub_in.data(), bytes, &sub_recv);
  t.post_send(right, key, out.data(), bytes, &send);
  sub->post_send(sub_right, key, sub_out.data(), bytes, &sub_send);
  t.post_recv(left, key, in.data(), bytes, &recv);
  const auto deadline = Clock::now() + case_limit;
  const std::vector<Completion*> parent_ops{&send, &recv}, sub_ops{&sub_send, &sub_recv};
  bool finished = false;
  while (!finished && Clock::now() < deadline)  // progress both: either may wait on the other's peers
    finished = await(t, parent_ops, 5ms) && await(*sub, sub_ops, 5ms);
  check(finished, "split: messages still pending at the deadline");
  for (Completion* c : {&send, &recv, &sub_send, &sub_recv})
    check(c->state() == Completion::done, "split: a message failed: " + c->error);
  if (recv.state() == Completion::done) {
    const std::string wrong = differs(in, left, me, 1, bytes);
    check(wrong.empty(), "parent: " + wrong);
  }
  if (sub_recv.state() == Completion::done) {
    const std::string wrong = differs(sub_in, sub_left, sub_rank, 2, bytes);
    check(wrong.empty(), "sub-communicator: " + wrong);
  }
  withdraw(*sub, sub_ops);
  withdraw(t, parent_ops);
  return check.text();
}

inline std::string split(Transport& t) { return split_with(t, Traits{}); }

/// A posted receive is cancelled before anything is sent for it: it is cancelled and its buffer
/// untouched; once both neighbours have cancelled theirs (they say so), a receive posted again
/// with the same key gets the message sent for it.
inline std::string cancel_posted_receive(Transport& t) {
  Checks check;
  const int p = t.size(), me = t.rank();
  const int right = (me + 1) % p, left = (me + p - 1) % p;
  const MessageKey key{Channel::point_to_point, 77, 0};
  std::vector<std::byte> in(1025, poison);
  Completion cancelled;
  t.post_recv(left, key, in.data(), 1024, &cancelled);
  t.progress();
  t.cancel(&cancelled);
  check(cancelled.state() == Completion::cancelled, "cancel: state " + std::to_string(cancelled.state()));
  // Tell both neighbours (tag 78 to the right, 79 to the left) and hear from both.
  std::byte said{1}, heard[2] = {poison, poison};
  Completion tell[2], hear[2];
  t.post_send(right, MessageKey{Channel::point_to_point, 78, 0}, &said, 1, &tell[0]);
  t.post_send(left, MessageKey{Channel::point_to_point, 79, 0}, &said, 1, &tell[1]);
  t.post_recv(left, MessageKey{Channel::point_to_point, 78, 0}, &heard[0], 1, &hear[0]);
  t.post_recv(right, MessageKey{Channel::point_to_point, 79, 0}, &heard[1], 1, &hear[1]);
  const std::vector<Completion*> talk{&tell[0], &tell[1], &hear[0], &hear[1]};
  check(await(t, talk), "cancel: neighbours not heard by the deadline");
  withdraw(t, talk);
  check(std::all_of(in.begin(), in.end(), [](std::byte b) { return b == poison; }), "a cancelled receive was written");
  std::vector<std::byte> out = message(me, right, 77, 1024);
  Completion send, recv;
  t.post_recv(left, key, in.data(), 1024, &recv);
  t.post_send(right, key, out.data(), out.size(), &send);
  check(await(t, {&send, &recv}), "cancel: the message after it is still pending");
  check(send.state() == Completion::done && recv.state() == Completion::done,
        "cancel: the message after it failed: " + send.error + recv.error);
  if (recv.state() == Completion::done) {
    const std::string wrong = differs(in, left, me, 77, 1024);
    check(wrong.empty(), wrong);
  }
  withdraw(t, {&send, &recv});
  return check.text();
}

/// The last rank aborts while every other rank waits for a message from it, asleep in a wait of
/// 20 s: each waiter wakes within 5 s, and every rank sees the same error and seq.
inline std::string abort_reaches_every_rank(Transport& t) {
  Checks check;
  const int p = t.size(), me = t.rank(), last = p - 1;
  const Error error(ErrorCode::aborted, "conformance: rank " + std::to_string(last) + " gave up");
  std::vector<std::byte> in(16, poison);
  Completion recv;
  const auto start = Clock::now();
  if (me == last) {
    std::this_thread::sleep_for(200ms);  // the others are asleep in wait by then
    t.abort(error, 42);
  } else {
    t.post_recv(last, MessageKey{Channel::point_to_point, 90, 0}, in.data(), in.size(), &recv);
  }
  const auto failure = await_abort(t, 20s, 20s);
  withdraw(t, {&recv});
  if (!failure) return "abort: not seen within 20 s\n";
  check(Clock::now() - start < 5s,
        "abort: seen only after " +
            std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count()) +
            " ms");
  check(failure->error.code() == ErrorCode::aborted && std::string(failure->error.what()) == error.what(),
        "abort: " + std::string(to_string(failure->error.code())) + ": " + failure->error.what());
  check(failure->seq == 42, "abort: seq " + std::to_string(failure->seq));
  check(in[0] == poison, "abort: the receive was written");
  return check.text();
}

}  // namespace tutti::testing::conformance
