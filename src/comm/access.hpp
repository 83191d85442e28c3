// The implementation behind a public Communicator, for the layers above comm (sparse, the
// engine, gpu, hierarchical) and the tests: the only way from a tutti::Communicator to its
// CommImpl, and the only way to make one over a transport of one's own. Users have the public
// read-only view instead (Communicator::transport_name, chosen_algorithm, serves_direct).
#pragma once

#include <memory>
#include <utility>

#include "comm/comm_impl.hpp"
#include "tutti/tutti.hpp"

namespace tutti::comm {

struct Access {
  /// `c`'s implementation; nullptr for an empty communicator.
  static CommImpl* impl(const Communicator& c) { return c.impl_.get(); }
  /// A communicator over `impl` (a transport of the caller's: CommImpl's constructor).
  static Communicator make(std::shared_ptr<CommImpl> impl) { return Communicator(std::move(impl)); }
};

}  // namespace tutti::comm
