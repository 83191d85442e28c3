#include "transport/shm/segment.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <new>
#include <thread>

#include "bootstrap/crypto.hpp"
#include "core/env.hpp"

namespace tutti::transport::shm {

namespace {

// What a peer reads in this process to find out whether it can (Segment::decide_single_copy).
const std::uint64_t probe_word = 0x7475747469636d61;  // "tutticma"

using clock = std::chrono::steady_clock;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

[[noreturn]] void fail_system(const std::string& what) {
  throw Error(ErrorCode::system, "shm: " + what + ": " + std::strerror(errno));
}

void fill_random(std::uint8_t* out, std::size_t size) {
  while (size > 0) {
    const ssize_t got = getrandom(out, size, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail_system("getrandom");
    out += got;
    size -= static_cast<std::size_t>(got);
  }
}

// Zeroed memory from ftruncate already holds zero-valued atomics; constructing them makes that official.
void construct(std::byte* base, const Layout& layout, std::uint64_t comm_id) {
  auto* header = new (base) Header{};
  header->total_bytes = layout.total;
  header->comm_id = comm_id;
  header->size = layout.size;
  header->slots = layout.slots;
  header->payload = layout.payload;
  fill_random(header->secret, sizeof header->secret);
  const auto p = static_cast<std::size_t>(layout.size);
  for (std::size_t r = 0; r < p; ++r) new (base + layout.rank_blocks + r * sizeof(RankBlock)) RankBlock{};
  for (std::size_t s = 0; s < p * signature_slots; ++s)
    new (base + layout.signatures + s * sizeof(SignatureSlot)) SignatureSlot{};
  for (std::size_t r = 0; r < p; ++r) new (base + layout.direct_rounds + r * sizeof(DirectRound)) DirectRound{};
  for (std::size_t pair = 0; pair < p * p; ++pair) new (base + layout.rings + pair * layout.ring_stride) RingHeader{};
  header->magic.store(ready_magic, std::memory_order_release);
}

// Maps the pages every collective touches (the header, rank blocks, signature slots and direct
// rounds) into this process now, writable, rather than at the first collective that touches each:
// without it a rank's first hundred or so small collectives each took a page fault or two (a
// 8-byte allreduce took 2.3 us over its first 110 calls at p = 2, 0.3 us after). The data sets
// and rings are left to fault in when used (they can be large). A hint: a kernel without
// MADV_POPULATE_WRITE (before Linux 5.14) faults them in later, as before.
void populate(std::byte* base, const Layout& layout) {
#ifdef MADV_POPULATE_WRITE
  madvise(base, layout.rings, MADV_POPULATE_WRITE);  // rings is page-aligned
#else
  (void)base, (void)layout;
#endif
}

std::byte* map(int fd, const Layout& layout) {
  void* base = mmap(nullptr, layout.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return nullptr;
  populate(static_cast<std::byte*>(base), layout);
  return static_cast<std::byte*>(base);
}

std::string octal_mode(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

// A segment is ours to use only if this user owns it and nobody else may open it.
bool private_to_us(const struct stat& st) { return st.st_uid == geteuid() && (st.st_mode & 07777 & ~0600u) == 0; }

[[noreturn]] void refuse(const std::string& path, const struct stat& st, const std::string& why) {
  throw Error(ErrorCode::system, "shm: refusing segment " + path + ": " + why + " (owned by uid " +
                                     std::to_string(st.st_uid) + " with mode " + octal_mode(st.st_mode) +
                                     "); this process, uid " + std::to_string(geteuid()) +
                                     ", uses only segments of its own user with mode 0600");
}

// The owner and mode of a name we could not use, read from /dev/shm (where Linux keeps them).
[[noreturn]] void refuse_name(const std::string& path, const std::string& why) {
  struct stat st {};
  if (stat(("/dev/shm" + path).c_str(), &st) == 0) refuse(path, st, why);
  throw Error(ErrorCode::system, "shm: refusing segment " + path + ": " + why);
}

// After every shm_open: the segment must be this user's, mode 0600 at most. Closes `fd` on refusal.
void check_private(int fd, const std::string& path) {
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int saved = errno;
    close(fd);
    errno = saved;
    fail_system("fstat(" + path + ")");
  }
  if (private_to_us(st)) return;
  close(fd);
  refuse(path, st, st.st_uid != geteuid() ? "it belongs to another user" : "its mode lets other users open it");
}

// Rank 0: a fresh segment, created exclusively. The name carries a random nonce, so a name that
// exists already was taken by someone else (or is a leftover of a crashed job reusing the name):
// we refuse it rather than remove or share it.
std::byte* create(const std::string& path, const Layout& layout, std::uint64_t comm_id) {
  const int fd = shm_open(path.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 && errno == EEXIST) refuse_name(path, "the name exists already");
  if (fd < 0) fail_system("shm_open(" + path + ")");
  if (fchmod(fd, 0600) != 0) {  // the umask may have narrowed it; peers of this user need rw
    const int saved = errno;
    close(fd);
    shm_unlink(path.c_str());
    errno = saved;
    fail_system("fchmod(" + path + ")");
  }
  try {
    check_private(fd, path);
  } catch (...) {
    shm_unlink(path.c_str());
    throw;
  }
  std::byte* base = nullptr;
  if (ftruncate(fd, static_cast<off_t>(layout.total)) == 0) base = map(fd, layout);
  const int saved = errno;
  close(fd);
  if (base == nullptr) {
    shm_unlink(path.c_str());
    errno = saved;
    fail_system("creating " + path + " (" + std::to_string(layout.total) + " bytes)");
  }
  construct(base, layout, comm_id);
  return base;
}

bool same_geometry(const Header& header, const Layout& layout, std::uint64_t comm_id) {
  return header.comm_id == comm_id && header.size == layout.size && header.slots == layout.slots &&
         header.payload == layout.payload && header.total_bytes == layout.total;
}

// Other ranks: the segment once rank 0 created and initialized it, or nullptr to retry later.
std::byte* try_open(const std::string& path, const Layout& layout, std::uint64_t comm_id, clock::time_point deadline) {
  const int fd = shm_open(path.c_str(), O_RDWR, 0);
  if (fd < 0) {
    if (errno == ENOENT) return nullptr;
    if (errno == EACCES) refuse_name(path, "it cannot be opened for writing");
    fail_system("shm_open(" + path + ")");
  }
  check_private(fd, path);
  struct stat st {};
  std::byte* base = nullptr;
  if (fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) == layout.total) base = map(fd, layout);
  close(fd);
  if (base == nullptr) return nullptr;  // not yet sized by rank 0
  auto& header = *reinterpret_cast<Header*>(base);
  while (header.magic.load(std::memory_order_acquire) != ready_magic && clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  if (header.magic.load(std::memory_order_acquire) == ready_magic && same_geometry(header, layout, comm_id))
    return base;
  munmap(base, layout.total);  // a stale segment of another communicator: wait for ours
  return nullptr;
}

}  // namespace

Layout Layout::for_size(int size) {
  Layout l;
  l.size = size;
  l.slots = 8;
  l.payload = 64 * 1024;
  const auto pairs = static_cast<std::size_t>(size) * static_cast<std::size_t>(size);
  constexpr std::size_t budget = 96u << 20;
  while (pairs * l.slots * (l.payload + chunk_header_bytes) > budget && l.payload > 4096) l.payload /= 2;
  while (pairs * l.slots * (l.payload + chunk_header_bytes) > budget && l.slots > 2) l.slots /= 2;
  l.slot_stride = chunk_header_bytes + l.payload;
  l.ring_stride = round_up(sizeof(RingHeader) + l.slots * l.slot_stride, 4096);
  l.rank_blocks = round_up(sizeof(Header), 64);
  l.signatures = l.rank_blocks + static_cast<std::size_t>(size) * sizeof(RankBlock);
  l.direct_rounds =
      round_up(l.signatures + static_cast<std::size_t>(size) * signature_slots * sizeof(SignatureSlot), 64);
  l.rings = round_up(l.direct_rounds + static_cast<std::size_t>(size) * sizeof(DirectRound), 4096);
  l.direct_data = l.rings + pairs * l.ring_stride;
  l.direct_chunk = 256 * 1024;
  l.direct_sets = 4;
  constexpr std::size_t direct_budget = 16u << 20;  // for the two sets that every segment uses
  while (2 * static_cast<std::size_t>(size) * l.direct_chunk > direct_budget && l.direct_chunk > 4096)
    l.direct_chunk /= 2;
  l.total = l.direct_data + l.direct_sets * static_cast<std::size_t>(size) * l.direct_chunk;
  return l;
}

std::unique_ptr<Segment> Segment::attach(const std::string& name, int rank, int size, std::uint64_t comm_id,
                                         clock::time_point deadline) {
  if (size < 1 || rank < 0 || rank >= size)
    throw Error(ErrorCode::invalid_argument,
                "shm: rank " + std::to_string(rank) + " is out of range for size " + std::to_string(size));
  if (name.empty() || name.find('/') != std::string::npos || name.size() > 200)
    throw Error(ErrorCode::invalid_argument, "shm: invalid segment name '" + name + "'");
  const Layout layout = Layout::for_size(size);
  const std::string path = "/" + name;
  const std::int32_t pid = static_cast<std::int32_t>(getpid());
  std::unique_ptr<Segment> segment;
  for (;;) {
    std::byte* base = rank == 0 ? create(path, layout, comm_id) : try_open(path, layout, comm_id, deadline);
    if (base != nullptr) {
      segment.reset(new Segment(name, layout, base));
      std::int32_t expected = 0;
      if (segment->rank_block(rank).pid.compare_exchange_strong(expected, pid)) break;
      segment.reset();  // our slot is taken: a stale segment (or a duplicate rank); retry until the deadline
    }
    if (clock::now() >= deadline)
      throw Error(ErrorCode::timeout, "shm: rank " + std::to_string(rank) + " could not open segment " + path +
                                          " before the deadline (is rank 0 running?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  Header& header = segment->header();
  segment->rank_block(rank).probe_address.store(reinterpret_cast<std::uintptr_t>(&probe_word),
                                                std::memory_order_relaxed);
  if (header.attached.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<std::uint32_t>(size))
    shm_unlink(path.c_str());  // everyone has it mapped: nothing is left behind, whatever happens next
  while (header.attached.load(std::memory_order_acquire) < static_cast<std::uint32_t>(size)) {
    if (clock::now() >= deadline) {
      shm_unlink(path.c_str());
      throw Error(ErrorCode::timeout, "shm: only " + std::to_string(header.attached.load()) + " of " +
                                          std::to_string(size) + " ranks attached to segment " + path +
                                          " before the deadline");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  segment->decide_single_copy(rank, deadline);
  segment->decide_collective_copy(rank, deadline);
  segment->direct_sets_ = ranks_outnumber_cores(size) ? 2 : segment->layout_.direct_sets;
  return segment;
}

// Every rank tries to read each peer's probe word, says what it found, and waits for the others'
// answers: single copy is used only where every rank can read every other.
void Segment::decide_single_copy(int rank, clock::time_point deadline) {
  const int size = layout_.size;
  bool reads = size > 1 && core::env("TUTTI_SHM_SINGLE_COPY").value_or("1") != "0";
  for (int q = 0; q < size && reads; ++q) {
    if (q == rank) continue;
    std::uint64_t word = 0;
    const RankBlock& peer = rank_block(q);
    reads = read_process_memory(peer.pid.load(std::memory_order_relaxed), reinterpret_cast<std::byte*>(&word),
                                peer.probe_address.load(std::memory_order_relaxed), sizeof word) == 0 &&
            word == probe_word;
  }
  rank_block(rank).reads_peers.store(reads ? 1 : 2, std::memory_order_release);
  single_copy_ = true;
  for (int q = 0; q < size; ++q) {
    std::uint32_t answer;
    while ((answer = rank_block(q).reads_peers.load(std::memory_order_acquire)) == 0) {
      if (clock::now() >= deadline)
        throw Error(ErrorCode::timeout, "shm: rank " + std::to_string(q) + " attached to segment /" + name_ +
                                            " but did not finish attaching before the deadline");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    single_copy_ = single_copy_ && answer == 1;
  }
}

namespace {

int move_process_memory(std::int32_t pid, std::byte* local, std::uint64_t remote, std::size_t bytes, bool write) {
  while (bytes > 0) {
    iovec mine{local, bytes};
    iovec theirs{reinterpret_cast<void*>(static_cast<std::uintptr_t>(remote)), bytes};
    const ssize_t n = write ? process_vm_writev(static_cast<pid_t>(pid), &mine, 1, &theirs, 1, 0)
                            : process_vm_readv(static_cast<pid_t>(pid), &mine, 1, &theirs, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : EIO;
    local += n, remote += static_cast<std::uint64_t>(n), bytes -= static_cast<std::size_t>(n);
  }
  return 0;
}

}  // namespace

int read_process_memory(std::int32_t pid, std::byte* local, std::uint64_t remote, std::size_t bytes) {
  return move_process_memory(pid, local, remote, bytes, false);
}

int write_process_memory(std::int32_t pid, std::uint64_t remote, const std::byte* local, std::size_t bytes) {
  // (process_vm_writev only reads the local side.)
  return move_process_memory(pid, const_cast<std::byte*>(local), remote, bytes, true);
}

Segment::~Segment() { munmap(base_, layout_.total); }

Error corrupt_segment(const Segment& segment, int writer, const std::string& what) {
  const std::string who = writer >= 0 ? "rank " + std::to_string(writer) : std::string("a rank");
  return Error(ErrorCode::peer_failure, "shm: " + who + " wrote " + what + " into segment /" + segment.name() +
                                            " (a bug, or another process writing into it)");
}

ChunkHeader read_chunk(const Segment& segment, int from, int to, std::uint64_t n) {
  // Once: the peer may change it meanwhile. The signature only where there is one (its line is
  // otherwise not touched, and a small eager message's payload lies there: header_payload_bytes).
  ChunkHeader h{};
  const ChunkHeader& written = segment.chunk(from, to, n);
  std::memcpy(static_cast<void*>(&h), &written, header_fields_bytes);
  if (h.has_signature == 1) std::memcpy(&h.signature, &written.signature, sizeof h.signature);
  const std::uint64_t payload = segment.layout().payload;
  // The sender cuts a message of `total` bytes into chunks of `payload` bytes, the last one shorter.
  // A message by reference is one chunk whose payload is the address of its bytes in the sender.
  const bool cut_right = h.by_reference == 1 ? h.offset == 0 && h.bytes == sizeof(std::uint64_t) &&
                                                   h.total >= segment.reference_from() &&
                                                   h.channel == static_cast<std::uint8_t>(Channel::point_to_point)
                                             : h.by_reference == 0 && h.offset <= h.total && h.offset % payload == 0 &&
                                                   h.bytes == std::min<std::uint64_t>(payload, h.total - h.offset);
  // An eager message is a whole small message in one chunk (a point-to-point one, or a collective's
  // of a call that runs ahead: ShmTransport::post_send).
  const bool eager_right = h.eager == 0 || (h.eager == 1 && h.by_reference == 0 && h.offset == 0 &&
                                            h.bytes == h.total && h.total <= eager_bytes);
  if (!cut_right || !eager_right || h.channel > static_cast<std::uint8_t>(Channel::point_to_point) ||
      h.has_signature > 1)
    throw corrupt_segment(segment, from,
                          "an invalid chunk header (total " + std::to_string(h.total) + ", offset " +
                              std::to_string(h.offset) + ", bytes " + std::to_string(h.bytes) +
                              (h.by_reference != 0 ? ", by reference " + std::to_string(h.by_reference) : "") +
                              (h.eager != 0 ? ", eager " + std::to_string(h.eager) : "") + ", channel " +
                              std::to_string(h.channel) + ", chunk payload " + std::to_string(payload) + ")");
  return h;
}

Ack read_ack(const Segment& segment, int from, int to, std::uint64_t n) {
  Ack ack;
  std::memcpy(&ack, &segment.ring(from, to).acks[n % ack_entries], sizeof ack);
  if (ack.channel > static_cast<std::uint8_t>(Channel::point_to_point) || ack.ok > 1)
    throw corrupt_segment(
        segment, to,
        "an invalid acknowledgement (channel " + std::to_string(ack.channel) + ", ok " + std::to_string(ack.ok) + ")");
  return ack;
}

std::uint64_t ring_fill(const Segment& segment, std::uint64_t head, std::uint64_t tail, std::uint64_t capacity,
                        int writer, std::string_view kind, int from, int to) {
  const std::uint64_t fill = head - tail;  // unsigned: a tail past the head wraps to a huge fill
  if (fill > capacity)
    throw corrupt_segment(segment, writer,
                          "invalid indices of the " + std::string(kind) + " ring from rank " + std::to_string(from) +
                              " to rank " + std::to_string(to) + " (head " + std::to_string(head) + ", tail " +
                              std::to_string(tail) + ", capacity " + std::to_string(capacity) + ")");
  return fill;
}

std::optional<Failure> read_abort(const Segment& segment) {
  const AbortRecord& record = segment.header().abort;
  if (record.state.load(std::memory_order_acquire) != 2) return std::nullopt;
  const std::int32_t code = record.code, rank = record.rank;
  const std::uint64_t seq = record.seq;
  const std::uint32_t length = record.length;
  if (rank < 0 || rank >= segment.layout().size || code < 0 || code > static_cast<std::int32_t>(ErrorCode::system) ||
      length > abort_text_bytes) {
    const int writer = rank >= 0 && rank < segment.layout().size ? rank : -1;
    return Failure{corrupt_segment(segment, writer,
                                   "an invalid abort record (rank " + std::to_string(rank) + ", code " +
                                       std::to_string(code) + ", text length " + std::to_string(length) + ")"),
                   no_seq};
  }
  // Up to the first NUL (where what() would stop); a record with no reason still names its writer.
  std::string text(record.text, ::strnlen(record.text, length));
  if (text.empty()) text = "shm: rank " + std::to_string(rank) + " aborted the communicator without giving a reason";
  return Failure{Error(static_cast<ErrorCode>(code), text), seq};
}

std::string split_segment_name(const Segment& parent, std::uint64_t id) {
  const Header& header = parent.header();
  const std::string key(reinterpret_cast<const char*>(header.secret), sizeof header.secret);
  char message[32];
  std::snprintf(message, sizeof message, "split %016llx", static_cast<unsigned long long>(id));
  const auto mac = bootstrap::hmac_sha256(key, message);
  static constexpr char digits[] = "0123456789abcdef";
  std::string hex;
  for (std::size_t i = 0; i < 12; ++i) {  // 96 bits: nobody guesses them
    hex.push_back(digits[mac[i] >> 4]);
    hex.push_back(digits[mac[i] & 0xf]);
  }
  // Nested splits lengthen the name; the hash alone tells communicators apart, so cut the prefix.
  return parent.name().substr(0, 150) + "-" + hex;
}

namespace {

long futex(std::atomic<std::uint32_t>& word, int op, std::uint32_t value, const timespec* timeout) {
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  return syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), op, value, timeout, nullptr, 0);
}

}  // namespace

void ring_doorbell(RankBlock& block) {
  // seq_cst on both sides (here and in sleep_on_doorbell): either the sleeper sees the new
  // generation before sleeping, or we see it counted among the sleepers and wake it.
  block.generation.fetch_add(1, std::memory_order_seq_cst);
  if (block.sleepers.load(std::memory_order_seq_cst) != 0) futex(block.generation, FUTEX_WAKE, INT_MAX, nullptr);
}

// seq_cst on both sides (here and in sleep_on_doorbell), as ring_doorbell: either the sleeper
// sees the local generation move, or we see it counted and ring the shared doorbell, whose
// generation the sleeper's FUTEX_WAIT compares.
void ring_local(LocalBell& bell, RankBlock& block) {
  bell.generation.fetch_add(1, std::memory_order_seq_cst);
  if (bell.sleepers.load(std::memory_order_seq_cst) != 0) ring_doorbell(block);
}

void ring_if_sleeping(Segment& segment, int to) {
  RankBlock& block = segment.rank_block(to);
  if (block.sleepers.load(std::memory_order_seq_cst) != 0) ring_doorbell(block);
}

namespace {

// doorbell_token for a doorbell generation read already (sleep_on_doorbell compares the token
// with the generation it then waits on).
std::uint64_t token_of(const Segment& segment, int rank, const LocalBell& bell, std::uint32_t generation, bool rings) {
  std::uint64_t sum = generation;
  for (int r = 0; rings && r < segment.layout().size; ++r) {
    const RingHeader& in = segment.ring(r, rank);
    const RingHeader& out = segment.ring(rank, r);
    // The stamp of the slot the consumer reads next, with the head: both lines travel at once.
    const std::uint32_t stamp = stamp_of(segment.chunk(r, rank, in.tail.load(std::memory_order_relaxed))).load();
    sum += in.head.load(std::memory_order_seq_cst) + stamp + in.ack_tail.load(std::memory_order_seq_cst) +
           out.ack_head.load(std::memory_order_seq_cst);
  }
  return std::uint64_t{bell.generation.load(std::memory_order_seq_cst)} << 32 | static_cast<std::uint32_t>(sum);
}

}  // namespace

std::uint64_t doorbell_token(const Segment& segment, int rank, const LocalBell& bell, bool rings) {
  return token_of(segment, rank, bell, segment.rank_block(rank).generation.load(std::memory_order_seq_cst), rings);
}

void sleep_on_doorbell(Segment& segment, int rank, LocalBell& bell, std::uint64_t seen, bool rings,
                       std::chrono::nanoseconds timeout) {
  if (timeout.count() <= 0) return;
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  RankBlock& block = segment.rank_block(rank);
  bell.sleepers.fetch_add(1, std::memory_order_seq_cst);
  block.sleepers.fetch_add(1, std::memory_order_seq_cst);
  // Counted first, then read: a peer that moved a counter after these reads sees us counted and
  // rings, which moves the generation FUTEX_WAIT compares.
  const std::uint32_t generation = block.generation.load(std::memory_order_seq_cst);
  if (token_of(segment, rank, bell, generation, rings) == seen) futex(block.generation, FUTEX_WAIT, generation, &ts);
  block.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  bell.sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace tutti::transport::shm
