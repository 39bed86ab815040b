"""Read a pickled ``torch.save`` archive without running any of its code.

anemoi's checkpoints are pickles of whole modules: they name anemoi, omegaconf, torch-geometric and torch classes,
and even ``builtins.getattr``. The unpickler here calls only the functions that rebuild tensors, numpy arrays and
plain containers (:data:`REBUILDERS`). Every other class or function of a module anemoi's files use
(:data:`INERT_PACKAGES`) becomes an :class:`Inert` stand-in that only records what it is given, so a module comes
back as a tree of ``Inert`` objects whose ``state`` holds its ``_parameters``, ``_buffers`` and ``_modules``. A
reference to anything else (``os.system``, ``builtins.eval``, ``subprocess``...) is refused before it is called.
"""

from __future__ import annotations

import collections
import datetime
import pickle
import types
from typing import Any

import numpy as np
import torch

try:  # numpy 2
    from numpy._core import multiarray
except ImportError:  # numpy 1
    from numpy.core import multiarray


class RefusedGlobal(pickle.UnpicklingError):
    """The pickle names a global that is neither rebuilt nor made inert; ``name`` is ``module.attribute``."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class Inert(dict):
    """A stand-in for a pickled object of class ``kind`` (``module.name``): its constructor arguments (``args``),
    its pickled state (``state``) and, as a dict, the items pickled into it. Calling it makes another stand-in."""

    kind = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> Inert:  # pickle makes objects by __new__ alone
        made = super().__new__(cls)
        made.args, made.state = args, kwargs or None
        return made

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        super().__init__()

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __call__(self, *args: Any, **kwargs: Any) -> Inert:
        made = _Result(*args, **kwargs)
        made.kind = f"result of {self.kind}"
        return made

    def append(self, item: Any) -> None:
        self.setdefault("_items", []).append(item)

    def extend(self, items: Any) -> None:
        self.setdefault("_items", []).extend(items)

    def add(self, item: Any) -> None:
        self.append(item)

    def __reduce__(self) -> tuple:  # never pickled again
        raise TypeError(f"an inert {self.kind} cannot be pickled")

    def __repr__(self) -> str:
        return f"<inert {self.kind}>"


class _Result(Inert):
    """What calling an inert stand-in gives: another stand-in, named after what was called."""


def _plain_defaultdict(*_args: Any) -> dict:
    """``collections.defaultdict``, whose factory is another global: a plain dict (the factory never runs)."""
    return {}


_NUMPY = ("_reconstruct", "scalar")  # numpy's array and scalar rebuilding
# module.name -> the real callable: tensor, array and container rebuilding only
REBUILDERS: dict[str, Any] = {
    "torch._utils._rebuild_tensor_v2": torch._utils._rebuild_tensor_v2,
    "torch._utils._rebuild_parameter": torch._utils._rebuild_parameter,
    "torch.Size": torch.Size,
    "torch.device": torch.device,
    "collections.OrderedDict": collections.OrderedDict,
    "collections.defaultdict": _plain_defaultdict,
    "numpy.ndarray": np.ndarray,
    "numpy.dtype": np.dtype,
    **{f"{m}.{f}": getattr(multiarray, f) for m in ("numpy._core.multiarray", "numpy.core.multiarray") for f in _NUMPY},
    "_codecs.encode": lambda text, encoding="utf-8": text.encode(encoding),  # numpy's byte strings
    "datetime.timedelta": datetime.timedelta,
    **{f"{b}.{t.__name__}": t for b in ("builtins", "__builtin__") for t in (dict, list, tuple, set, frozenset)},
    **{f"{b}.{t.__name__}": t for b in ("builtins", "__builtin__") for t in (int, float, str, bytes, bool, complex)},
    "__builtin__.long": int,
    "__builtin__.unicode": str,
}
REBUILDERS.update({f"torch.{n}": getattr(torch, n) for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype)})
# the packages whose classes and functions anemoi's checkpoints name: each becomes an inert stand-in, never called
INERT_PACKAGES = {"anemoi", "omegaconf", "hydra", "torch", "torch_geometric", "typing", "pathlib", "inspect"}
INERT_NAMES = {"builtins.getattr", "builtins.type", "builtins.object", "builtins.slice", "_operator.getitem"}


def _canonical(module: str, name: str) -> str:
    module = {"__builtin__": "builtins", "copy_reg": "copyreg"}.get(module, module)
    return f"{module}.{name}"


class _Unpickler(pickle.Unpickler):
    """Rebuilds tensors and containers, makes known classes inert, refuses everything else."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._inert: dict[str, type[Inert]] = {}

    def find_class(self, module: str, name: str) -> Any:
        full = f"{module}.{name}"
        if full in REBUILDERS:
            return REBUILDERS[full]
        canonical = _canonical(module, name)
        if canonical in INERT_NAMES or module.split(".")[0] in INERT_PACKAGES:
            if canonical not in self._inert:
                self._inert[canonical] = type(name, (Inert,), {"kind": canonical})
            return self._inert[canonical]
        raise RefusedGlobal(canonical)


# what ``torch.load(..., pickle_module=...)`` reads a zip archive's data.pkl with
safe_pickle_module = types.SimpleNamespace(Unpickler=_Unpickler, __name__="anemo_like_safe_pickle")


def module_tensors(module: Inert, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every parameter and buffer (non-persistent ones too) of a pickled ``nn.Module`` (an inert tree), by the
    dotted names ``state_dict`` would give them; None entries (absent biases) are left out."""
    state = module.state if isinstance(module.state, dict) else {}
    found = {
        f"{prefix}{name}": tensor.detach()
        for key in ("_parameters", "_buffers")
        for name, tensor in (state.get(key) or {}).items()
        if isinstance(tensor, torch.Tensor)
    }
    for name, child in (state.get("_modules") or {}).items():
        if isinstance(child, Inert):
            found.update(module_tensors(child, f"{prefix}{name}."))
    return found


def stored_mapping(storage: Any) -> dict[str, Any]:
    """The attributes a pickled torch-geometric storage (node, edge or global store) holds."""
    state = storage.state if isinstance(storage, Inert) and isinstance(storage.state, dict) else {}
    mapping = state.get("_mapping")
    return dict(mapping) if isinstance(mapping, dict) else {}
