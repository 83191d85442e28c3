"""Horovod's API over Tutti (docs/horovod.md): `import tutti.horovod.torch as hvd`.

This package holds the framework-independent part: `run` (Horovod's programmatic launcher, which
Tutti does not provide: jobs start with `tutti-run -n N python3 script.py`).
"""

from tutti import __version__  # noqa: F401
from tutti._errors import Unsupported


def run(*args, **kwargs):
    """Horovod's `horovod.run`: not provided. Raises tutti.Unsupported; launch with tutti-run."""
    raise Unsupported("tutti.horovod.run is not supported: launch the script with tutti-run -n N python3 SCRIPT")
