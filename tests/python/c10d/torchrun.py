"""torchrun (python -m torch.distributed.run) for Debian's torch 1.13 on Python 3.11.

torch 1.13's Std.from_str tests `Std(0) in Std`, which is False on Python 3.11 (0 is no member of
an IntFlag there), so every plain torchrun fails with "'NoneType' object has no attribute 'get'"
before it starts a worker. This wrapper maps the plain numbers right and runs torchrun's own main
unchanged: its elastic agent, its c10d rendezvous and the env:// variables it gives the workers.
"""

import re
import sys

from torch.distributed.elastic.multiprocessing import api
from torch.distributed.run import main

_from_str = api.Std.from_str


def _fixed_from_str(value):
    parsed = _from_str(value)
    if parsed is None and re.fullmatch(r"[0-3]", value):
        return api.Std(int(value))
    return parsed


api.Std.from_str = _fixed_from_str

if __name__ == "__main__":
    sys.exit(main())
