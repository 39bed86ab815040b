"""``model.compile``: compile every submodule of the configured classes in place with ``torch.compile``.

Each entry names a class by its dotted path; every submodule of exactly that class (not a subclass) gets a compiled
call, as ``nn.Module.compile`` installs it, so the module tree, parameters and state_dict keys stay the same.

torch compiles lazily, at a module's first call (and again when shapes, grad mode or other guarded state change).
Each compiled module's calls therefore go through ``_CompiledCall``, which times the first call of each class
(compilation included) and turns a torch.compile failure into a ``RuntimeError`` naming the class and module path,
or, with ``on_error="eager"``, into one warning after which every module of that class runs uncompiled.

Failures while compiling the backward graph (torch compiles it at the first backward) are raised by ``backward()``
and are not caught here.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn
from torch._dynamo import trace_rules
from torch._dynamo.exc import TorchDynamoException
from torch._dynamo.external_utils import wrap_inline

from anemo_like.config.schema import CompileEntry

logger = logging.getLogger(__name__)

OnError = Literal["raise", "eager"]


@dataclass
class CompileReport:
    """What ``compile_modules`` compiled; the timing and fallback fields fill in as the modules run."""

    modules: dict[str, list[str]]
    """Configured class path -> paths of the submodules compiled (``""`` is the model itself)."""
    first_call_seconds: dict[str, float] = field(default_factory=dict)
    """Class path -> wall time of the first compiled call of that class, compilation included."""
    eager: dict[str, str] = field(default_factory=dict)
    """Class path -> first line of the compile error that sent its modules back to eager."""


def _qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _first_line(error: BaseException) -> str:
    """``Type: first line`` of the backend's own error when dynamo wrapped one (BackendCompilerFailed), else of
    ``error``."""
    inner = getattr(error, "inner_exception", None) or error
    line = next((text.strip() for text in str(inner).splitlines() if text.strip()), "")
    return f"{type(inner).__name__}: {line}" if line else type(inner).__name__


def _allowed_options() -> list[str]:
    """Keyword arguments of ``torch.compile`` (this torch version), the first positional one excepted."""
    return [name for name in inspect.signature(torch.compile).parameters if name != "model"]


def _resolve_class(path: str, key: str, model_classes: list[str]) -> type[nn.Module]:
    """Import the class at dotted ``path``; a ValueError names ``key``, the path and a close model class."""
    module_name, _, class_name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name) if module_name else None
    except (ImportError, AttributeError):
        cls = None
    if isinstance(cls, type) and issubclass(cls, nn.Module):
        return cls
    problem = "does not import" if cls is None else "is not an nn.Module subclass"
    close = difflib.get_close_matches(path, model_classes, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise ValueError(f"{key}: '{path}' {problem}{hint}")


def _check_options(options: dict[str, Any], key: str) -> None:
    allowed = _allowed_options()
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"{key}: unknown torch.compile option(s) {unknown}; allowed: {', '.join(allowed)}")


def _compiled(module: nn.Module, options: dict[str, Any]) -> Callable[..., Any]:
    """``torch.compile`` of the module's call, as ``nn.Module.compile`` makes it.

    For a class whose ``forward`` dynamo skips as a top-level frame (torch.nn built-ins such as LayerNorm),
    ``nn.Module.compile`` leaves nothing to compile (pytorch/pytorch#150915): give dynamo an extra frame around the
    call, as ``torch.compile(module)`` does for those classes.
    """
    call = module._call_impl
    return torch.compile(wrap_inline(call) if trace_rules.check(module.forward) else call, **options)


@dataclass
class _CompiledClass:
    """The compiled modules of one configured class and what happened to them."""

    path: str
    modules: list[nn.Module]
    on_error: OnError
    report: CompileReport

    def first_call(self, module_path: str, seconds: float) -> None:
        if self.path not in self.report.first_call_seconds:
            self.report.first_call_seconds[self.path] = seconds
            logger.info(
                "model.compile: first call of %s at %s took %.2f s (compiling included)",
                self.path,
                module_path,
                seconds,
            )

    def failed(self, module_path: str, error: Exception) -> None:
        """Raise a RuntimeError naming the class and module, or switch every module of the class to eager."""
        cause = _first_line(error)
        message = f"model.compile: compiling {self.path} at {module_path} failed: {cause}"
        if self.on_error == "raise":
            raise RuntimeError(message) from error
        logger.warning("%s; running its %d modules eagerly (model.compile_on_error=eager)", message, len(self.modules))
        for module in self.modules:
            module._compiled_call_impl = None
        self.report.eager[self.path] = cause


class _CompiledCall:
    """A module's compiled call (``module._compiled_call_impl``) that reports its class's first call and failures."""

    def __init__(self, module: nn.Module, module_path: str, owner: _CompiledClass, options: dict[str, Any]) -> None:
        self.module, self.module_path, self.owner = module, module_path, owner
        self.compiled = _compiled(module, options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():  # traced inside another compiled module: become part of its graph
            return self.module._call_impl(*args, **kwargs)
        start = time.perf_counter()
        try:
            result = self.compiled(*args, **kwargs)
        except TorchDynamoException as error:  # dynamo and inductor failures (inductor's derive from it)
            self.owner.failed(self.module_path, error)
            return self.module._call_impl(*args, **kwargs)
        self.owner.first_call(self.module_path, time.perf_counter() - start)
        return result


def _set_recompile_limit(limit: int) -> None:
    config = torch._dynamo.config
    # torch < 2.7 names it cache_size_limit
    setattr(config, "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit", limit)


def compile_modules(
    model: nn.Module, entries: Sequence[CompileEntry], *, recompile_limit: int, on_error: OnError = "raise"
) -> CompileReport:
    """Compile, in place, every submodule of ``model`` whose class is exactly one of ``entries``' classes.

    Every entry is checked before anything is compiled: a ValueError names the ``model.compile[i]`` key when a
    class path does not import, is not an ``nn.Module``, has no module in ``model`` or is listed twice, or when
    an option is not a ``torch.compile`` keyword. Sets ``torch._dynamo.config.recompile_limit``.
    """
    named = list(model.named_modules())
    model_classes = sorted({_qualified_name(type(m)) for _, m in named})
    resolved: dict[type[nn.Module], tuple[str, dict[str, Any]]] = {}
    for i, entry in enumerate(entries):
        key = f"model.compile[{i}]"
        cls = _resolve_class(entry.module, f"{key}.module", model_classes)
        if cls in resolved:
            raise ValueError(f"{key}.module: {entry.module} is already listed as {resolved[cls][0]}")
        if not any(type(m) is cls for _, m in named):
            classes = ", ".join(model_classes)
            raise ValueError(f"{key}.module: the model has no module of class {entry.module}; its classes: {classes}")
        _check_options(entry.options, f"{key}.options")
        resolved[cls] = (entry.module, entry.options)

    _set_recompile_limit(recompile_limit)
    report = CompileReport(modules={})
    for cls, (path, options) in resolved.items():
        matches = [(name, m) for name, m in named if type(m) is cls]
        owner = _CompiledClass(path, [m for _, m in matches], on_error, report)
        for name, module in matches:
            module._compiled_call_impl = _CompiledCall(module, name, owner, options)
        report.modules[path] = [name for name, _ in matches]
    if report.modules:
        summary = ", ".join(f"{path} ({len(names)} modules)" for path, names in report.modules.items())
        logger.info("model.compile: compiling %s; recompile_limit %d", summary, recompile_limit)
    return report
