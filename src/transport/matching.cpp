#include "transport/matching.hpp"

#include <utility>

namespace tutti::transport {

void prepare(Completion* done, int peer, const MessageKey& key, bool is_send) {
  done->peer = peer;
  done->is_send = is_send;
  done->key = key;
  done->error.clear();
  done->set(Completion::posted);
}

std::string size_mismatch(int sender, std::optional<std::size_t> sent, int receiver, std::size_t expected,
                          const MessageKey& key) {
  const std::string amount = sent ? std::to_string(*sent) : "more than " + std::to_string(expected);
  const std::string which =
      key.channel == Channel::collective ? "collective #" + std::to_string(key.seq) : "tag " + std::to_string(key.seq);
  return "message size mismatch: rank " + std::to_string(sender) + " sent " + amount + " bytes but rank " +
         std::to_string(receiver) + " expected " + std::to_string(expected) + " (" + which + ", message " +
         std::to_string(key.index) + ")";
}

Error collective_mismatch(int rank_a, const Signature& a, int rank_b, const Signature& b) {
  const bool a_first = rank_a <= rank_b;
  const int first = a_first ? rank_a : rank_b, second = a_first ? rank_b : rank_a;
  const Signature& first_called = a_first ? a : b;
  const Signature& second_called = a_first ? b : a;
  return Error(ErrorCode::mismatch, "mismatched collective: rank " + std::to_string(first) + " called " +
                                        first_called.describe() + " but rank " + std::to_string(second) + " called " +
                                        second_called.describe());
}

}  // namespace tutti::transport
