#include "core/call.hpp"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/buffer.hpp"

namespace tutti_python {

namespace {

// Requests dropped before they completed, with the owners of their buffers: the operation still
// reads or writes them. Swept (under the GIL) whenever a request is made or dropped; leaked at
// exit on purpose, since the memory may still be in use and the interpreter is gone.
struct Dropped {
  tutti::Request request;
  PreparedCall call;
};
std::vector<Dropped>& dropped() {
  static auto* list = new std::vector<Dropped>();
  return *list;
}

// Whether `request` completed. A failure counts as complete: it aborted the communicator, so the
// next call on it raises the failure; nobody waits on this handle any more.
bool finished(tutti::Request& request) {
  try {
    return request.test();
  } catch (const tutti::Error&) {
    return true;
  }
}

void sweep_dropped() {
  auto& list = dropped();
  std::vector<Dropped> done;
  for (auto it = list.begin(); it != list.end();) {
    if (finished(it->request)) {
      done.push_back(std::move(*it));
      it = list.erase(it);
    } else {
      ++it;
    }
  }
  // `done` is destroyed here, once the list is consistent again: releasing a buffer may run Python
  // code (an exporter's __del__) that drops another request and so sweeps again.
}

}  // namespace

PyRequest::PyRequest(tutti::Request request, PreparedCall call)
    : request_(std::move(request)), call_(std::move(call)) {}

PyRequest::PyRequest(PyRequest&& other) noexcept
    : request_(std::move(other.request_)), call_(std::move(other.call_)), issued_(other.issued_) {
  other.call_.reset();
}

PyRequest::~PyRequest() {
  if (!call_) return;  // complete or moved from
  if (!finished(request_)) dropped().push_back({request_, std::move(*call_)});
  sweep_dropped();
}

void PyRequest::complete() { call_.reset(); }

bool PyRequest::wait(const py::object& timeout) {
  if (!call_) return true;
  bool complete_now = true;
  if (timeout.is_none()) {
    py::gil_scoped_release release;
    request_.wait();
  } else {
    const auto limit = milliseconds_of(timeout, "Request.wait");
    py::gil_scoped_release release;
    complete_now = request_.wait_for(limit, issued_);
  }
  if (complete_now) complete();
  return complete_now;
}

bool PyRequest::test() {
  if (!call_) return true;
  bool complete_now = false;
  {
    py::gil_scoped_release release;
    complete_now = request_.test();
  }
  if (complete_now) complete();
  return complete_now;
}

void run_blocking(tutti::Communicator& comm, PreparedCall call) {
  // `call` (and with it the owners) is destroyed after the release below ends: under the GIL.
  py::gil_scoped_release release;
  call.start(comm, false);
}

PyRequest run_nonblocking(tutti::Communicator& comm, PreparedCall call) {
  sweep_dropped();
  tutti::Request request;
  {
    py::gil_scoped_release release;
    request = call.start(comm, true);
  }
  return PyRequest(std::move(request), std::move(call));
}

std::chrono::milliseconds milliseconds_of(const py::handle& timeout, const char* operation) {
  if (timeout.is_none()) return std::chrono::milliseconds(0);
  double seconds = 0;
  try {
    seconds =
        py::hasattr(timeout, "total_seconds") ? timeout.attr("total_seconds")().cast<double>() : timeout.cast<double>();
  } catch (const py::cast_error&) {
    invalid(std::string(operation) + ": timeout must be seconds (a number or a datetime.timedelta), not " +
            std::string(py::str(py::type::of(timeout).attr("__name__"))));
  }
  if (!(seconds >= 0) || seconds > 1e9)
    invalid(std::string(operation) + ": timeout " + std::to_string(seconds) + " s is negative or not finite");
  const auto ms = static_cast<long long>(std::ceil(seconds * 1000.0));
  return std::chrono::milliseconds(seconds > 0 && ms == 0 ? 1 : ms);
}

}  // namespace tutti_python
