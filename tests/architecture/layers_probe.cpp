// Built only by the ctest layers_build, as part of the schedule layer (it links tutti_schedule and
// sees only the include roots of schedule and of the layers it declares, src/layers.cmake):
// including a header of the transport layer, a layer before schedule that schedule does not
// declare, must fail to compile, which is what that test expects.
#include "schedule/schedule.hpp"
#include "transport/transport.hpp"
