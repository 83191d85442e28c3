// Built only by the ctest layers_build, as part of the transport layer (it links tutti_transport
// and sees only that layer's include roots): including a header of the comm layer above must fail
// to compile, which is what that test expects.
#include "comm/comm_impl.hpp"
#include "transport/transport.hpp"
