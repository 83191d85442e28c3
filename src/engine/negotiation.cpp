#include "engine/negotiation.hpp"

#include <algorithm>
#include <cstring>

namespace tutti::engine {

std::string Descriptor::shape() const {
  std::string text =
      std::string(to_string(kind)) + " of " + std::to_string(count) + " " + std::string(tutti::to_string(type));
  if (!dims.empty()) {
    text += " [";
    for (std::size_t i = 0; i < dims.size(); ++i) text += (i ? ", " : "") + std::to_string(dims[i]);
    text += "]";
  }
  if (kind == Collective::allreduce) text += " (" + std::string(tutti::to_string(op)) + ")";
  if (kind == Collective::broadcast) text += " from root " + std::to_string(root);
  return text;
}

namespace {

class Writer {
 public:
  template <class T>
  void put(T value) {
    const auto* p = reinterpret_cast<const std::byte*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void put_string(const std::string& s) {
    put(static_cast<std::uint32_t>(s.size()));
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    bytes_.insert(bytes_.end(), p, p + s.size());
  }
  std::vector<std::byte>& bytes() { return bytes_; }

 private:
  std::vector<std::byte> bytes_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  template <class T>
  T get() {
    need(sizeof(T));
    T value;
    std::memcpy(&value, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  std::string get_string() {
    const auto n = get<std::uint32_t>();
    need(n);
    std::string s(reinterpret_cast<const char*>(bytes_.data() + at_), n);
    at_ += n;
    return s;
  }
  std::span<const std::byte> take(std::size_t n) {
    need(n);
    auto s = bytes_.subspan(at_, n);
    at_ += n;
    return s;
  }
  bool done() const { return at_ == bytes_.size(); }

 private:
  void need(std::size_t n) const {
    if (bytes_.size() - at_ < n) throw Error(ErrorCode::system, "engine: a negotiation message is truncated");
  }
  std::span<const std::byte> bytes_;
  std::size_t at_ = 0;
};

// The same on every rank and every build (std::hash need not be).
std::uint32_t slot_hash(std::uint32_t slot, const Descriptor& d) {
  std::uint64_t h = detail::fnv1a(&slot, sizeof slot);
  h = detail::fnv1a(d.name, h);
  const std::uint8_t kind[3] = {static_cast<std::uint8_t>(d.kind), static_cast<std::uint8_t>(d.type),
                                static_cast<std::uint8_t>(d.op)};
  h = detail::fnv1a(kind, sizeof kind, h);
  h = detail::fnv1a(&d.root, sizeof d.root, h);
  h = detail::fnv1a(&d.count, sizeof d.count, h);
  h = detail::fnv1a(d.dims.data(), d.dims.size() * sizeof(std::int64_t), h);
  return static_cast<std::uint32_t>(h ^ (h >> 32));
}

constexpr std::uint8_t kShuttingDown = 1;
constexpr std::uint8_t kAborting = 2;
constexpr std::uint8_t kWaiting = 4;
constexpr std::uint8_t kJoined = 8;

}  // namespace

std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (std::size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return (ranks.size() == 1 ? "rank " : "ranks ") + text;
}

std::vector<std::byte> Message::encode(std::size_t cache_size) const {
  Writer w;
  w.put(static_cast<std::uint8_t>((shutting_down ? kShuttingDown : 0) | (aborting ? kAborting : 0) |
                                  (waiting ? kWaiting : 0) | (joined ? kJoined : 0)));
  w.put(static_cast<std::uint32_t>(cache_size));
  std::vector<std::byte> bits((cache_size + 7) / 8);
  for (auto slot : cached) bits.at(slot / 8) |= static_cast<std::byte>(1u << (slot % 8));
  w.bytes().insert(w.bytes().end(), bits.begin(), bits.end());
  w.put(static_cast<std::uint32_t>(described.size()));
  for (const auto& d : described) {
    w.put(static_cast<std::uint8_t>(d.kind));
    w.put(static_cast<std::uint8_t>(d.type));
    w.put(static_cast<std::uint8_t>(d.op));
    w.put(d.root);
    w.put(d.count);
    w.put_string(d.name);
    w.put(static_cast<std::uint8_t>(d.dims.size()));
    for (auto n : d.dims) w.put(n);
  }
  w.put(static_cast<std::uint32_t>(expired.size()));
  for (const auto& name : expired) w.put_string(name);
  return std::move(w.bytes());
}

Message Message::decode(std::span<const std::byte> bytes, std::size_t cache_size) {
  Reader r(bytes);
  Message m;
  const auto flags = r.get<std::uint8_t>();
  m.shutting_down = (flags & kShuttingDown) != 0;
  m.aborting = (flags & kAborting) != 0;
  m.waiting = (flags & kWaiting) != 0;
  m.joined = (flags & kJoined) != 0;
  if (r.get<std::uint32_t>() != cache_size)
    throw Error(ErrorCode::system, "engine: the ranks' response caches disagree (a negotiation message is damaged)");
  const auto bits = r.take((cache_size + 7) / 8);
  for (std::size_t slot = 0; slot < cache_size; ++slot)
    if ((static_cast<unsigned>(bits[slot / 8]) >> (slot % 8)) & 1u)
      m.cached.push_back(static_cast<std::uint32_t>(slot));
  const auto described = r.get<std::uint32_t>();
  for (std::uint32_t i = 0; i < described; ++i) {
    Descriptor d;
    d.kind = static_cast<Collective>(r.get<std::uint8_t>());
    d.type = static_cast<DataType>(r.get<std::uint8_t>());
    d.op = static_cast<ReduceOp>(r.get<std::uint8_t>());
    d.root = r.get<std::int32_t>();
    d.count = r.get<std::uint64_t>();
    d.name = r.get_string();
    const auto dims = r.get<std::uint8_t>();
    if (dims > kMaxDims) throw Error(ErrorCode::system, "engine: a negotiation message is damaged");
    for (std::uint8_t k = 0; k < dims; ++k) d.dims.push_back(r.get<std::int64_t>());
    if (!engine_collective(d.kind) || d.type > DataType::f64 || d.op > ReduceOp::avg)
      throw Error(ErrorCode::system, "engine: a negotiation message is damaged");
    m.described.push_back(std::move(d));
  }
  const auto expired = r.get<std::uint32_t>();
  for (std::uint32_t i = 0; i < expired; ++i) m.expired.push_back(r.get_string());
  if (!r.done()) throw Error(ErrorCode::system, "engine: a negotiation message has trailing bytes");
  return m;
}

std::optional<std::uint32_t> Table::cached_slot(const Descriptor& d) const {
  const auto it = cache_slot_.find(d.name);
  if (it == cache_slot_.end() || !cache_[it->second].same_shape(d)) return std::nullopt;
  return it->second;
}

void Table::announce(int rank, const Descriptor& d, std::chrono::steady_clock::time_point now, Decision& decision) {
  auto [it, fresh] = pending_.try_emplace(d.name);
  Entry& e = it->second;
  if (fresh) {
    e.order = next_order_++;
    e.ranks.resize(static_cast<std::size_t>(size_));
    e.since = now;
  }
  auto& slot = e.ranks[static_cast<std::size_t>(rank)];
  if (slot) {
    // Only a tensor that already failed can be announced twice by one rank (it was enqueued again
    // after its failure); it fails again.
    if (!e.failure)
      throw Error(ErrorCode::system, "engine: rank " + std::to_string(rank) + " announced '" + d.name + "' twice");
    decision.failed.push_back(*e.failure);
    return;
  }
  slot = d;
  ++e.announced;
  // A rank that announces a tensor that already failed (it expired) learns of it in this cycle.
  if (e.failure) decision.failed.push_back(*e.failure);
}

std::optional<Decision::Failure> Table::disagreement(const std::string& name, const Entry& e) const {
  // Ranks grouped by what they enqueued, in rank order; one group when they agree.
  std::vector<std::pair<const Descriptor*, std::vector<int>>> shapes;
  for (int r = 0; r < size_; ++r) {
    const Descriptor& d = *e.ranks[static_cast<std::size_t>(r)];
    auto s = std::find_if(shapes.begin(), shapes.end(), [&](const auto& g) { return g.first->same_shape(d); });
    if (s == shapes.end())
      shapes.push_back({&d, {r}});
    else
      s->second.push_back(r);
  }
  if (shapes.size() == 1) return std::nullopt;
  std::string message = "engine: mismatched tensor '" + name + "': ";
  for (std::size_t i = 0; i < shapes.size(); ++i)
    message += (i ? "; " : "") + rank_list(shapes[i].second) + " enqueued " + shapes[i].first->shape();
  return Decision::Failure{name, ErrorCode::mismatch, message};
}

Tally Table::tally(std::span<const std::uint32_t> sums) const {
  if (sums.size() != Tally::kHeader + cache_.size())
    throw Error(ErrorCode::system, "engine: a negotiation round has the wrong length for this rank's response cache");
  const auto n = static_cast<std::uint32_t>(size_);
  // Every rank contributed its cache's size and hash; the sums (mod 2^32) are n times this rank's
  // exactly when every rank's are this rank's (but for a hash collision).
  if (sums[3] != n * static_cast<std::uint32_t>(cache_.size()) || sums[4] != n * cache_hash_)
    throw Error(ErrorCode::system, "engine: the ranks' response caches disagree");
  Tally t;
  t.exchange = sums[0];
  t.waiting = sums[1];
  t.fresh = sums[2];
  t.pending.assign(sums.begin() + Tally::kHeader, sums.end());
  if (t.exchange > n || t.waiting > n || t.fresh > n ||
      std::any_of(t.pending.begin(), t.pending.end(), [&](std::uint32_t c) { return c > n; }))
    throw Error(ErrorCode::system, "engine: a negotiation round is damaged");
  return t;
}

void Table::backdate(const std::string& name, std::chrono::steady_clock::time_point since) {
  if (auto it = pending_.find(name); it != pending_.end() && since < it->second.since) it->second.since = since;
}

void Table::set_slot(std::uint32_t slot, const Descriptor& d) {
  cache_hash_ ^= slot_hash(slot, cache_[slot]) ^ slot_hash(slot, d);
  cache_[slot] = d;
}

void Table::remember(const Descriptor& d) {
  if (const auto it = cache_slot_.find(d.name); it != cache_slot_.end()) {
    set_slot(it->second, d);  // the same name, reshaped on every rank alike: never the stale description
    used_[it->second] = cycle_;
    return;
  }
  if (cache_capacity_ == 0) return;
  std::uint32_t slot = 0;
  if (cache_.size() < cache_capacity_) {
    slot = static_cast<std::uint32_t>(cache_.size());
    cache_.push_back(d);
    used_.push_back(cycle_);
    cache_hash_ ^= slot_hash(slot, d);
  } else {
    // Full: the slot ready least recently (the lowest such slot), unless every slot was ready in
    // this very cycle; then the name goes uncached.
    slot = static_cast<std::uint32_t>(std::min_element(used_.begin(), used_.end()) - used_.begin());
    if (used_[slot] == cycle_) return;
    cache_slot_.erase(cache_[slot].name);
    set_slot(slot, d);
    used_[slot] = cycle_;
  }
  cache_slot_.emplace(d.name, slot);
}

Decision Table::apply(const Tally& tally, const std::vector<Message>& messages,
                      std::chrono::steady_clock::time_point now) {
  ++cycle_;
  Decision decision;
  // The cached path: a slot every rank holds is ready (on every rank alike, in slot order).
  if (!tally.pending.empty() && tally.pending.size() != cache_.size())
    throw Error(ErrorCode::system, "engine: a negotiation round has the wrong length for this rank's response cache");
  bool partial = false;
  for (std::size_t slot = 0; slot < tally.pending.size(); ++slot) {
    const auto held = tally.pending[slot];
    if (held == static_cast<std::uint32_t>(size_)) {
      used_[slot] = cycle_;
      decision.ready.push_back(cache_[slot]);
    } else if (held > 0) {
      partial = true;
    }
  }
  if (messages.empty()) {  // the steady state: the tally is all there is
    decision.waiting_ranks = static_cast<int>(tally.waiting);
    decision.all_waiting = tally.waiting == static_cast<std::uint32_t>(size_);
    decision.progress = tally.fresh > 0 || !decision.ready.empty();
    partial_ = partial;
    return decision;
  }
  // A full exchange: every rank moved what it held on the cached path, not ready, into its message.
  partial_ = false;
  exchange(messages, now, decision);
  return decision;
}

void Table::exchange(const std::vector<Message>& messages, std::chrono::steady_clock::time_point now,
                     Decision& decision) {
  if (messages.size() != static_cast<std::size_t>(size_))
    throw Error(ErrorCode::system, "engine: expected one negotiation message per rank");
  std::vector<int> leaving;  // ranks shutting down: they will never announce again
  decision.all_waiting = true;
  for (int r = 0; r < size_; ++r) {
    const Message& m = messages[static_cast<std::size_t>(r)];
    if (m.shutting_down) leaving.push_back(r);
    if (m.aborting) decision.aborted_by.push_back(r);
    decision.all_waiting = decision.all_waiting && m.waiting;
    decision.waiting_ranks += m.waiting ? 1 : 0;
    decision.progress = decision.progress || !m.cached.empty() || !m.described.empty() || !m.expired.empty();
    for (auto slot : m.cached) {
      if (slot >= cache_.size()) throw Error(ErrorCode::system, "engine: a negotiation message names an unknown slot");
      announce(r, cache_[slot], now, decision);
    }
    for (const auto& d : m.described) announce(r, d, now, decision);
  }
  // Ranks that joined (in rank order, so the last of a cycle is its highest).
  if (joined_.empty()) joined_.assign(static_cast<std::size_t>(size_), false);
  for (int r = 0; r < size_; ++r)
    if (messages[static_cast<std::size_t>(r)].joined && !joined_[static_cast<std::size_t>(r)]) {
      joined_[static_cast<std::size_t>(r)] = true;
      last_joined_ = r;
      decision.progress = true;
    }
  answer_for_joined(decision);
  // Rank 0's verdicts on stalled tensors: the tensor fails on every rank that enqueued it. Rank 0
  // judged from the table before this cycle; a tensor the last ranks announced in this same cycle
  // is not stalled any more and runs (every rank applies the same messages, so all agree).
  for (const auto& name : messages[0].expired) {
    auto it = pending_.find(name);
    if (it == pending_.end() || it->second.failure || it->second.announced == size_) continue;
    std::vector<int> enqueued, missing;
    for (int r = 0; r < size_; ++r) (it->second.ranks[static_cast<std::size_t>(r)] ? enqueued : missing).push_back(r);
    it->second.failure =
        Decision::Failure{name, ErrorCode::timeout,
                          "engine: tensor '" + name + "' was enqueued by " + rank_list(enqueued) + " but never by " +
                              rank_list(missing) + " within the stall limit (TUTTI_STALL_SHUTDOWN_S)"};
    decision.failed.push_back(*it->second.failure);
  }
  // What a rank shutting down has not announced can never run.
  const bool all_shutting = leaving.size() == static_cast<std::size_t>(size_);
  if (!leaving.empty() && !all_shutting) {
    for (auto& [name, e] : pending_) {
      if (e.announced == size_ || e.failure) continue;
      std::vector<int> gone;
      for (int r : leaving)
        if (!e.ranks[static_cast<std::size_t>(r)]) gone.push_back(r);
      if (gone.empty()) continue;
      e.failure = Decision::Failure{name, ErrorCode::aborted,
                                    "engine: tensor '" + name + "' can never complete: " + rank_list(gone) +
                                        " destroyed the engine without enqueuing it"};
      decision.failed.push_back(*e.failure);
    }
  }
  // Tensors every rank has announced: ready (in order of first announcement) or done failing.
  std::vector<std::pair<std::uint64_t, Descriptor>> ready;
  for (auto it = pending_.begin(); it != pending_.end();) {
    Entry& e = it->second;
    if (e.announced < size_) {
      ++it;
      continue;
    }
    if (!e.failure) {
      if (auto mismatch = disagreement(it->first, e))
        decision.failed.push_back(std::move(*mismatch));
      else
        ready.emplace_back(e.order, *e.ranks[0]);
    }
    it = pending_.erase(it);
  }
  std::sort(ready.begin(), ready.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [order, d] : ready) {
    remember(d);
    decision.ready.push_back(std::move(d));
  }
  decision.shutdown = all_shutting;
  if (std::all_of(joined_.begin(), joined_.end(), [](bool j) { return j; })) {
    decision.joined = true;
    decision.last_joined = last_joined_;
    joined_.assign(static_cast<std::size_t>(size_), false);
    last_joined_ = -1;
  }
  decision.progress = decision.progress || !decision.ready.empty() || !decision.failed.empty();
}

void Table::answer_for_joined(Decision& decision) {
  // A rank that joined takes part in the others' allreduces with zeros (it announces, in effect,
  // what the first rank announced); their allgathers and broadcasts fail, as in Horovod, since a
  // joined rank has no data to gather or send.
  if (std::none_of(joined_.begin(), joined_.end(), [](bool j) { return j; })) return;
  for (auto& [name, e] : pending_) {
    if (e.announced == size_) continue;
    const Descriptor* first = nullptr;
    for (const auto& d : e.ranks)
      if (d) {
        first = &*d;
        break;
      }
    if (first == nullptr) continue;
    const Descriptor model = *first;
    std::vector<int> joined;
    for (int r = 0; r < size_; ++r) {
      auto& slot = e.ranks[static_cast<std::size_t>(r)];
      if (slot || !joined_[static_cast<std::size_t>(r)]) continue;
      slot = model;
      ++e.announced;
      joined.push_back(r);
    }
    if (joined.empty() || model.kind == Collective::allreduce || e.failure) continue;
    e.failure = Decision::Failure{name, ErrorCode::mismatch,
                                  "engine: tensor '" + name + "': " + rank_list(joined) +
                                      " joined (Engine::join) and takes part in allreduces only, not in this " +
                                      std::string(to_string(model.kind))};
    decision.failed.push_back(*e.failure);
  }
}

std::vector<Waiting> Table::waiting() const {
  std::vector<Waiting> out;
  for (const auto& [name, e] : pending_) {
    if (e.announced == size_ || e.failure) continue;
    Waiting w{name, {}, {}, e.since};
    for (int r = 0; r < size_; ++r) (e.ranks[static_cast<std::size_t>(r)] ? w.enqueued : w.missing).push_back(r);
    out.push_back(std::move(w));
  }
  return out;
}

std::vector<std::vector<std::size_t>> plan_fusion(std::span<const Descriptor> ready, std::size_t fusion_threshold,
                                                  std::size_t first_bucket_bytes, bool step_start) {
  std::vector<std::vector<std::size_t>> jobs;
  std::vector<std::size_t> bytes;                             // per job
  std::map<std::pair<DataType, ReduceOp>, std::size_t> open;  // (type, op) -> its open bucket in jobs
  bool first = step_start;
  for (std::size_t i = 0; i < ready.size(); ++i) {
    const auto& d = ready[i];
    const std::size_t size = d.count * size_of(d.type);
    if (d.kind != Collective::allreduce) {
      jobs.push_back({i});
      bytes.push_back(size);
      continue;
    }
    const std::size_t cap = first ? std::min(first_bucket_bytes, fusion_threshold) : fusion_threshold;
    const auto key = std::make_pair(d.type, d.op);
    auto it = open.find(key);
    if (it != open.end() && bytes[it->second] + size <= cap) {
      jobs[it->second].push_back(i);
      bytes[it->second] += size;
      continue;
    }
    if (it != open.end()) first = false;  // the first bucket is full: later ones take the full threshold
    jobs.push_back({i});
    bytes.push_back(size);
    open[key] = jobs.size() - 1;
  }
  return jobs;
}

}  // namespace tutti::engine
