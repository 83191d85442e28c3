"""Tutti's exceptions: one class for each C++ ErrorCode, all under tutti.Error.

Every extension module of the package translates a C++ tutti::Error into the class of its code,
with the C++ message intact (python/src/common/errors.hpp), so that `except tutti.Timeout` works
the same for the core module, the torch.distributed backend and tutti.horovod.torch.
"""


class Error(RuntimeError):
    """A failure Tutti reports. `code` is the C++ ErrorCode's name ("timeout", ...)."""

    code = "error"


class InvalidArgument(Error, ValueError):
    """A bad argument (named in the message), rejected before anything was written."""

    code = "invalid_argument"


class Mismatch(Error):
    """The ranks called different collectives, or with different arguments."""

    code = "mismatch"


class Timeout(Error, TimeoutError):
    """A wait ran past its deadline; the message names the ranks waited for."""

    code = "timeout"


class PeerFailure(Error):
    """A peer died or its connection broke; the message names it."""

    code = "peer_failure"


class Aborted(Error):
    """The communicator was aborted (by this rank or a peer)."""

    code = "aborted"


class Unsupported(Error, NotImplementedError):
    """The operation is not supported by Tutti (or by this build)."""

    code = "unsupported"


class SystemError_(Error, OSError):
    """An operating-system call failed; the message has its errno text."""

    code = "system"


BY_CODE = {c.code: c for c in (InvalidArgument, Mismatch, Timeout, PeerFailure, Aborted, Unsupported, SystemError_)}
