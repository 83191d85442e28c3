"""Joining a job torchrun started, for tutti.init() and hvd.init().

Tutti's C++ init() reads tutti-run's, mpirun's and srun's variables, and torchrun's rank and size;
what it cannot use is torchrun's store (torch's TCPStore at MASTER_ADDR:MASTER_PORT). From Python
it can: torch.distributed's own env:// rendezvous gives the store (the agent's under torchrun, or
one rank 0 hosts), and the ranks meet there under the prefix "tutti/". A job of more ranks that
cannot be joined fails with what to set; it never becomes a quiet job of one rank.
"""

import datetime
import os

from ._errors import InvalidArgument

# Launchers whose variables win over torchrun's (C++ init() reads them first, or they name a store).
_BEFORE_TORCHRUN = ("TUTTI_RANK", "TUTTI_SIZE", "TUTTI_STORE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                    "PMI_RANK", "PMI_SIZE")


def _int(name):
    text = os.environ.get(name, "")
    return int(text) if text.isdigit() else None


def torchrun_store(timeout=None):
    """(store, rank, size) through torchrun's store when torchrun (RANK, WORLD_SIZE) started this
    process for a job of more than one rank and no TUTTI_STORE is set; else None, and C++ init()
    reads the environment (it also reports malformed values, naming the variable)."""
    env = os.environ
    if any(name in env for name in _BEFORE_TORCHRUN):
        return None
    rank, size = _int("RANK"), _int("WORLD_SIZE")
    if rank is None or size is None or size <= 1 or rank >= size:
        return None
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not env.get(name)]
    if missing:
        raise InvalidArgument(
            f"tutti: rank {rank} of {size} (RANK, WORLD_SIZE) was started without {' and '.join(missing)}: "
            "torchrun sets them; a launcher of your own must set MASTER_ADDR and MASTER_PORT (the store rank 0 "
            "hosts), or TUTTI_STORE and TUTTI_JOB_ID")
    try:
        import torch.distributed as dist
    except ImportError as error:
        raise InvalidArgument(
            f"tutti: rank {rank} of {size} was started by torchrun, whose store needs torch.distributed "
            f"({error}); set TUTTI_STORE and TUTTI_JOB_ID instead") from error
    if timeout is None:
        timeout = datetime.timedelta(milliseconds=int(env.get("TUTTI_TIMEOUT_MS", "300000")))
    store, _, _ = next(dist.rendezvous("env://", rank, size, timeout=timeout))
    return dist.PrefixStore("tutti/", store), rank, size
