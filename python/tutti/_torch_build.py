"""The torch the package's torch modules (tutti._c10d, tutti.horovod._horovod) were built against,
checked before either is loaded.

Loading a module linked against one libtorch into a process that has imported another ends the
process (the two libraries' static registrations collide: "terminate called after throwing an
instance of 'std::system_error'"), before any check inside the module could run. So the build
writes the version it compiled against into tutti/_torch_version.py, and require_built_torch()
compares it with the imported torch first, raising ImportError that names both.
"""

import torch


def require_built_torch(what):
    """Raises ImportError unless `torch` is the major.minor release this package was built
    against. `what` names the module being imported, for the message."""
    try:
        from tutti._torch_version import TORCH_VERSION
    except ImportError:
        return  # built without libtorch: the module's own import fails, naming itself
    built = TORCH_VERSION.split(".")[:2]
    running = torch.__version__.split("+")[0].split(".")[:2]
    if built != running:
        raise ImportError(
            f"{what} was built against torch {TORCH_VERSION}, but this process imports torch "
            f"{torch.__version__} ({torch.__file__}): build or pip install tutti with this "
            f"torch's interpreter (docs/python.md, \"Install\")")
