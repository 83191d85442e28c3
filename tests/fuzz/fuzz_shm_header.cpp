// What a peer writes into a shared-memory segment (transport/shm/segment.hpp) and a rank then
// reads: a chunk slot's header, an ack entry, a ring's head and tail, the abort record, a
// signature slot. One real segment for 2 ranks is made once per process (both ranks attached
// from this process, so its name is unlinked at once: nothing is left in /dev/shm, whatever
// happens); each input scribbles over those records as a hostile rank would and calls the
// readers on them. Each must return what its header comment promises, checked here against that
// promise restated independently, or throw tutti::Error(peer_failure) naming the writer and the
// segment. Anything else (a crash, a sanitizer report, an out-of-range value accepted, another
// exception) is a finding.
//
// Input, read in order (fields past the end are zero; little-endian, no padding):
//   u8 routes   bit 0/1: chunk ring from/to; bit 2/3: ack ring from/to; bit 4/5: ring_fill's ring
//   u64 slot, u64 ack_index
//   the chunk header's bytes (sizeof(ChunkHeader), layout as in memory), the ack's (sizeof(Ack))
//   u64 head, tail, ack_head, ack_tail
//   abort record: u32 state, i32 code, i32 rank, u64 seq, u32 length
//   signature slot: u64 seq, u64 tag, 5 x u64 words
//   the rest: the abort record's text (at most abort_text_bytes)
//
// The signature slot's own reader (read_slot) is private to shm_signatures.cpp: it returns the five words
// when the tag is the slot's seq + 1. What a peer controls there is what they decode to, checked
// here as the transport uses them: compared with this rank's signature (operator==) and, when
// they differ, described in a mismatch report.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "fuzz_signature.hpp"
#include "fuzz_support.hpp"
#include "transport/shm/segment.hpp"
#include "transport/shm/shm_transport.hpp"

using tutti::fuzz::require;
namespace transport = tutti::transport;
namespace shm = tutti::transport::shm;

namespace {

constexpr int ranks = 2;

// Both ranks' mappings of one segment, attached once; the name is unlinked once both are in.
struct Fixture {
  std::unique_ptr<shm::Segment> segment, other;
  Fixture() {
    const std::string name = "tutti-fuzz-" + std::to_string(::getpid()) + "-shm-header";
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    std::thread second([&] { other = shm::Segment::attach(name, 1, ranks, 1, deadline); });
    segment = shm::Segment::attach(name, 0, ranks, 1, deadline);
    second.join();
    require(segment != nullptr && other != nullptr, "could not attach the segment");
  }
};

const Fixture& fixture() {
  static const Fixture instance;
  return instance;
}

// Fields in order from the input; zero past its end.
class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  void bytes(void* out, std::size_t n) {
    const std::size_t take = std::min(n, size_ - used_);
    std::memset(out, 0, n);
    if (take > 0) std::memcpy(out, data_ + used_, take);
    used_ += take;
  }
  template <typename T>
  T take() {
    T value;
    bytes(&value, sizeof value);
    return value;
  }
  const std::uint8_t* rest() const { return data_ + used_; }
  std::size_t left() const { return size_ - used_; }

 private:
  const std::uint8_t* data_;
  std::size_t size_, used_ = 0;
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A corrupt record's error: peer_failure, naming the segment and (when it is known) the writer.
void require_named(const tutti::Error& e, int writer, const shm::Segment& segment, const char* what) {
  require(e.code() == tutti::ErrorCode::peer_failure, what);
  const std::string text = e.what();
  require(contains(text, "/" + segment.name()), "a corrupt record's error does not name the segment");
  if (writer >= 0)
    require(contains(text, "shm: rank " + std::to_string(writer) + " wrote "),
            "a corrupt record's error does not name its writer");
}

void check_chunk(const shm::Segment& segment, int from, int to, std::uint64_t slot, const shm::ChunkHeader& written) {
  std::memcpy(&segment.chunk(from, to, slot), &written, sizeof written);
  const std::uint64_t payload = segment.layout().payload;
  // What the sender's chunking gives: the message cut into chunks of `payload` bytes, the last
  // shorter; or a point-to-point message of reference_from() or more by reference, one chunk whose
  // payload is an 8-byte address; either may be eager (below).
  const bool cut = written.by_reference == 0 && written.offset <= written.total && written.offset % payload == 0 &&
                   written.bytes == std::min<std::uint64_t>(payload, written.total - written.offset);
  const bool by_reference = written.by_reference == 1 && written.offset == 0 && written.bytes == 8 &&
                            written.total >= segment.reference_from() &&
                            written.channel == static_cast<std::uint8_t>(transport::Channel::point_to_point);
  // An eager message: a whole message of at most eager_bytes, in one chunk (point to point, or a
  // collective's of a call that runs ahead).
  const bool eager = written.eager == 0 || (written.eager == 1 && written.by_reference == 0 && written.offset == 0 &&
                                            written.bytes == written.total && written.total <= shm::eager_bytes);
  const bool valid = (cut || by_reference) && eager &&
                     written.channel <= static_cast<std::uint8_t>(transport::Channel::point_to_point) &&
                     written.has_signature <= 1;
  shm::ChunkHeader h;
  try {
    h = shm::read_chunk(segment, from, to, slot);
  } catch (const tutti::Error& e) {
    require(!valid, "read_chunk refused a valid chunk header");
    require_named(e, from, segment, "read_chunk's error is not peer_failure");
    return;
  }
  require(valid, "read_chunk accepted an invalid chunk header");
  require(h.seq == written.seq && h.total == written.total && h.offset == written.offset && h.index == written.index &&
              h.bytes == written.bytes && h.channel == written.channel && h.has_signature == written.has_signature &&
              h.by_reference == written.by_reference && h.eager == written.eager &&
              h.signature == (h.has_signature ? written.signature : shm::ChunkHeader{}.signature),
          "read_chunk returned other fields than were written");
  // What the receiver then relies on: the chunk fits the slot's payload and the message.
  require(h.bytes <= payload && h.offset <= h.total && h.bytes <= h.total - h.offset,
          "an accepted chunk does not fit its slot or its message");
  if (h.has_signature) tutti::fuzz::check_signature(h.signature);
}

void check_ack(const shm::Segment& segment, int from, int to, std::uint64_t index, const shm::Ack& written) {
  std::memcpy(&segment.ring(from, to).acks[index % shm::ack_entries], &written, sizeof written);
  const bool valid =
      written.channel <= static_cast<std::uint8_t>(transport::Channel::point_to_point) && written.ok <= 1;
  shm::Ack ack;
  try {
    ack = shm::read_ack(segment, from, to, index);
  } catch (const tutti::Error& e) {
    require(!valid, "read_ack refused a valid ack");
    require_named(e, to, segment, "read_ack's error is not peer_failure");
    return;
  }
  require(valid, "read_ack accepted an invalid ack");
  require(ack.seq == written.seq && ack.expected == written.expected && ack.index == written.index &&
              ack.channel == written.channel && ack.ok == written.ok,
          "read_ack returned other fields than were written");
}

void check_fill(const shm::Segment& segment, std::atomic<std::uint64_t>& head_word,
                std::atomic<std::uint64_t>& tail_word, std::uint64_t head, std::uint64_t tail, std::uint64_t capacity,
                int writer, const char* kind, int from, int to) {
  head_word.store(head, std::memory_order_release);
  tail_word.store(tail, std::memory_order_release);
  const std::uint64_t seen_head = head_word.load(std::memory_order_acquire);
  const std::uint64_t seen_tail = tail_word.load(std::memory_order_acquire);
  const bool valid = seen_head - seen_tail <= capacity;
  std::uint64_t fill = 0;
  try {
    fill = shm::ring_fill(segment, seen_head, seen_tail, capacity, writer, kind, from, to);
  } catch (const tutti::Error& e) {
    require(!valid, "ring_fill refused valid indices");
    require_named(e, writer, segment, "ring_fill's error is not peer_failure");
    require(contains(e.what(), std::string(kind) + " ring"), "ring_fill's error does not name the ring");
    return;
  }
  require(valid, "ring_fill accepted invalid indices");
  require(fill <= capacity && fill == seen_head - seen_tail, "ring_fill returned a fill past the capacity");
}

struct AbortFields {
  std::uint32_t state;
  std::int32_t code, rank;
  std::uint64_t seq;
  std::uint32_t length;
};

void check_abort(const shm::Segment& segment, const AbortFields& f, const std::uint8_t* text, std::size_t text_size) {
  shm::AbortRecord& record = segment.header().abort;
  record.state.store(0, std::memory_order_relaxed);
  record.code = f.code;
  record.rank = f.rank;
  record.seq = f.seq;
  record.length = f.length;
  std::memset(record.text, 0, sizeof record.text);
  std::memcpy(record.text, text, std::min(text_size, sizeof record.text));
  record.state.store(f.state, std::memory_order_release);
  std::optional<transport::Failure> failure;
  try {
    failure = shm::read_abort(segment);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "read_abort threw: %s\n", e.what());
    require(false, "read_abort threw instead of returning the corrupt record's error");
  }
  record.state.store(0, std::memory_order_relaxed);  // the next input starts from no abort
  if (f.state != 2) {
    require(!failure.has_value(), "read_abort reported an abort that was not (yet) recorded");
    return;
  }
  require(failure.has_value(), "read_abort missed a recorded abort");
  const bool valid = f.rank >= 0 && f.rank < ranks && f.code >= 0 &&
                     f.code <= static_cast<std::int32_t>(tutti::ErrorCode::system) && f.length <= shm::abort_text_bytes;
  if (!valid) {
    require_named(failure->error, f.rank >= 0 && f.rank < ranks ? f.rank : -1, segment,
                  "a corrupt abort record's error is not peer_failure");
    require(failure->seq == transport::no_seq, "a corrupt abort record kept its seq");
    require(contains(failure->error.what(), "invalid abort record"), "a corrupt abort record is not named");
    return;
  }
  require(failure->error.code() == static_cast<tutti::ErrorCode>(f.code) && failure->seq == f.seq,
          "read_abort returned another code or seq than recorded");
  // The recorded text up to its first NUL (where what() would stop); a record with none (or one
  // that a NUL cuts to nothing) must still say who aborted.
  const std::string recorded(record.text, ::strnlen(record.text, f.length));
  const std::string message = failure->error.what();
  if (!recorded.empty())
    require(message == recorded, "read_abort's text is not the recorded one");
  else
    require(contains(message, "rank " + std::to_string(f.rank) + " "), "an abort without a reason does not say who");
}

void check_signature_slot(const shm::Segment& segment, std::uint64_t seq, std::uint64_t tag,
                          const std::uint64_t (&words)[5]) {
  // A slot holds the signature but its seq (the tag says it): words[0] goes to the arrivals word
  // beside it, which a peer may also fill with anything.
  shm::SignatureSlot& slot = segment.signature_slot(0, seq);
  for (int i = 0; i < 4; ++i) slot.words[i].store(words[i + 1], std::memory_order_relaxed);
  slot.arrivals.store(words[0], std::memory_order_relaxed);
  slot.tag.store(tag, std::memory_order_release);
  transport::WireSignature theirs;
  if (!shm::read_slot(slot, seq, theirs)) {  // not (or no longer) seq's: ignored
    require(tag != seq + 1, "read_slot ignored a slot tagged with its seq");
    return;
  }
  require(theirs.seq == seq, "read_slot gave another seq than the tag's");
  tutti::fuzz::check_signature(theirs);
  transport::Signature mine;
  mine.seq = seq;
  mine.collective = tutti::Collective::allreduce;
  mine.count = 4;
  mine.type = tutti::DataType::f32;
  mine.op = tutti::ReduceOp::sum;
  mine.algorithm = tutti::Algorithm::ring;
  if (theirs == transport::to_wire(mine)) return;
  const tutti::Error e = transport::collective_mismatch(0, transport::from_wire(theirs), 1, mine);
  require(e.code() == tutti::ErrorCode::mismatch && contains(e.what(), "mismatched collective: rank 0 called "),
          "a mismatch report is not named");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const shm::Segment& segment = *fixture().segment;
  Reader in(data, size);
  const auto routes = in.take<std::uint8_t>();
  const int chunk_from = routes & 1, chunk_to = (routes >> 1) & 1;
  const int ack_from = (routes >> 2) & 1, ack_to = (routes >> 3) & 1;
  const int fill_from = (routes >> 4) & 1, fill_to = (routes >> 5) & 1;
  const auto slot = in.take<std::uint64_t>();
  const auto ack_index = in.take<std::uint64_t>();
  shm::ChunkHeader chunk;
  in.bytes(&chunk, sizeof chunk);
  shm::Ack ack;
  in.bytes(&ack, sizeof ack);
  const auto head = in.take<std::uint64_t>(), tail = in.take<std::uint64_t>();
  const auto ack_head = in.take<std::uint64_t>(), ack_tail = in.take<std::uint64_t>();
  AbortFields abort_fields;
  abort_fields.state = in.take<std::uint32_t>();
  abort_fields.code = in.take<std::int32_t>();
  abort_fields.rank = in.take<std::int32_t>();
  abort_fields.seq = in.take<std::uint64_t>();
  abort_fields.length = in.take<std::uint32_t>();
  const auto signature_seq = in.take<std::uint64_t>();
  const auto signature_tag = in.take<std::uint64_t>();
  std::uint64_t words[5];
  for (auto& word : words) word = in.take<std::uint64_t>();

  check_chunk(segment, chunk_from, chunk_to, slot, chunk);
  check_ack(segment, ack_from, ack_to, ack_index, ack);
  // The data ring from->to: `to` moves the tail, `from` the head; either may be the liar.
  shm::RingHeader& ring = segment.ring(fill_from, fill_to);
  check_fill(segment, ring.head, ring.tail, head, tail, segment.layout().slots, fill_from, "data", fill_from, fill_to);
  check_fill(segment, ring.ack_head, ring.ack_tail, ack_head, ack_tail, shm::ack_entries, fill_to, "ack", fill_to,
             fill_from);
  check_abort(segment, abort_fields, in.rest(), in.left());
  check_signature_slot(segment, signature_seq, signature_tag, words);
  return 0;
}
