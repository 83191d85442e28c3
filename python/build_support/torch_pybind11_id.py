"""Prints the pybind11 internals id of the torch this interpreter imports (build time only).

Extension modules that pass torch's own objects (the c10d backend, tutti.horovod.torch) must be
compiled against a pybind11 whose internals id matches the one torch registered, or torch's
classes are unknown to them at import. pybind11 keeps its internals under that id: in builtins
(pybind11 < 2.11) or in the interpreter's state dict (newer releases).
"""
import builtins
import ctypes
import sys

import torch  # noqa: F401  (importing it registers its internals)

PREFIX = "__pybind11_internals_v"
keys = [k for k in vars(builtins) if k.startswith(PREFIX)]
if not keys:
    api = ctypes.pythonapi
    api.PyInterpreterState_Get.restype = ctypes.c_void_p
    api.PyInterpreterState_GetDict.restype = ctypes.py_object
    api.PyInterpreterState_GetDict.argtypes = [ctypes.c_void_p]
    state = api.PyInterpreterState_GetDict(api.PyInterpreterState_Get())
    keys = [k for k in state if isinstance(k, str) and k.startswith(PREFIX)]
if len(keys) != 1:
    sys.exit("torch registered %d pybind11 internals ids: %s" % (len(keys), keys))
print(keys[0], end="")
