# SPDX-License-Identifier: Apache-2.0
"""Resource chains from one-line specs, and installing them as the current device resource.

>>> from rmm_fences.compose import parse_spec
>>> parse_spec("sync_on_free(naive_cache(cuda_async), mode=deferred)")
Spec(name='sync_on_free', inner=Spec(name='naive_cache', inner=Spec(name='cuda_async', ...

Grammar: ``name`` or ``name(inner, key=value, ...)``; the inner resource comes first and only
adaptors take one. Sizes take ints or strings such as ``512MiB`` or ``2GB``. ``parse_spec``
needs no GPU; ``compose`` builds the resources (on the current device).
"""

from __future__ import annotations

import dataclasses
import re

from rmm_fences._sizes import parse_bytes

__all__ = ["Spec", "SpecError", "RESOURCES", "parse_spec", "compose", "install"]


class SpecError(ValueError):
    """A spec that does not parse or names something unknown; the message shows the spec
    with a caret under the fault."""

    def __init__(self, spec: str, column: int, message: str):
        self.spec, self.column = spec, column
        super().__init__(f"{message}\n  {spec}\n  {' ' * column}^")


@dataclasses.dataclass(frozen=True)
class Spec:
    """One resource of a chain: its name, its upstream (``inner``) and its arguments."""

    name: str
    inner: Spec | None = None
    kwargs: tuple[tuple[str, object], ...] = ()

    def __str__(self):
        parts = ([str(self.inner)] if self.inner else []) + [
            f"{k}={v}" for k, v in self.kwargs]
        return f"{self.name}({', '.join(parts)})" if parts else self.name


@dataclasses.dataclass(frozen=True)
class _Kind:
    adaptor: bool
    params: dict  # name -> "size" | "int" | "bool" | tuple of choices
    required: tuple = ()
    doc: str = ""


RESOURCES = {
    "cuda": _Kind(False, {}, doc="rmm CudaMemoryResource (cudaMalloc/cudaFree)"),
    "cuda_async": _Kind(False, {"initial_pool_size": "size", "release_threshold": "size"},
                        doc="rmm CudaAsyncMemoryResource (cudaMallocAsync)"),
    "managed": _Kind(False, {}, doc="rmm ManagedMemoryResource"),
    "rmm_pool": _Kind(True, {"initial_pool_size": "size", "maximum_pool_size": "size"},
                      doc="rmm PoolMemoryResource"),
    "arena": _Kind(True, {"arena_size": "size"}, doc="rmm ArenaMemoryResource"),
    "limiting": _Kind(True, {"allocation_limit": "size"}, ("allocation_limit",),
                      doc="rmm LimitingResourceAdaptor"),
    "statistics": _Kind(True, {}, doc="rmm StatisticsResourceAdaptor"),
    "pool": _Kind(True, {"initial_pool_size": "size", "maximum_pool_size": "size"},
                  doc="rmm_fences StreamOrderedPoolMemoryResource"),
    "sync_on_free": _Kind(True, {"mode": ("deferred", "stream", "device"),
                                 "max_pending_bytes": "size"},
                          doc="rmm_fences SyncOnFreeResourceAdaptor"),
    "tracking": _Kind(True, {"on_hazard": ("warn", "raise", "record"), "capture_stacks": "bool",
                             "upstream_stream_ordered": "bool", "nvtx": "bool"},
                      doc="rmm_fences HazardTrackingResourceAdaptor"),
    "naive_cache": _Kind(True, {}, doc="rmm_fences.unsafe NaiveCachingMemoryResource"),
    "vmm_unmap": _Kind(False, {"reserve_size": "size", "device": "int"},
                       doc="rmm_fences.unsafe UnmappingVmmMemoryResource"),
}

_TOKEN = re.compile(r"\s*(?:(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<value>[0-9][0-9.]*\s*[A-Za-z]*)"
                    r"|(?P<str>'[^']*'|\"[^\"]*\")|(?P<punct>[(),=]))")


def _tokens(spec: str):
    pos, out = 0, []
    while pos < len(spec):
        if spec[pos:].strip() == "":
            break
        m = _TOKEN.match(spec, pos)
        if not m:
            col = len(spec) - len(spec[pos:].lstrip())
            raise SpecError(spec, col, f"unexpected character {spec[col]!r}")
        kind = m.lastgroup
        text = m.group(kind)
        out.append((kind, text.strip(), m.start(kind)))
        pos = m.end()
    out.append(("end", "", len(spec)))
    return out


def _names(kinds) -> str:
    return ", ".join(sorted(kinds))


class _Parser:
    def __init__(self, spec: str):
        self.spec = spec
        self.toks = _tokens(spec)
        self.i = 0

    def peek(self):
        return self.toks[self.i]

    def take(self):
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def expect(self, text):
        kind, got, col = self.take()
        if got != text:
            raise SpecError(self.spec, col,
                            f"expected {text!r}, got {got!r}" if got else f"expected {text!r}")

    def resource(self) -> Spec:
        kind, name, col = self.take()
        if kind != "name":
            raise SpecError(self.spec, col, "expected a resource name; valid: "
                            + _names(RESOURCES))
        if name not in RESOURCES:
            raise SpecError(self.spec, col,
                            f"unknown resource {name!r}; valid: {_names(RESOURCES)}")
        info = RESOURCES[name]
        inner, kwargs, seen = None, [], set()
        if self.peek()[1] == "(":
            self.take()
            first = True
            while self.peek()[1] != ")":
                if self.peek()[0] == "end":
                    raise SpecError(self.spec, self.peek()[2], f"{name}( is never closed")
                if not first:
                    self.expect(",")
                first = False
                kind, text, acol = self.peek()
                if kind == "end":
                    raise SpecError(self.spec, acol, f"{name}( is never closed")
                is_kw = kind == "name" and self.toks[self.i + 1][1] == "="
                if is_kw:
                    self.take()
                    self.take()
                    if text not in info.params:
                        valid = _names(info.params) if info.params else "none"
                        raise SpecError(self.spec, acol,
                                        f"{name} takes no argument {text!r}; valid: {valid}")
                    if text in seen:
                        raise SpecError(self.spec, acol, f"{text!r} given twice")
                    seen.add(text)
                    kwargs.append((text, self.value(name, text, info.params[text])))
                else:
                    if kwargs or inner is not None:
                        raise SpecError(self.spec, acol,
                                        "the upstream resource comes first, once")
                    if not info.adaptor:
                        raise SpecError(self.spec, acol,
                                        f"{name} takes no upstream resource")
                    inner = self.resource()
            self.take()
        if info.adaptor and inner is None:
            raise SpecError(self.spec, col, f"{name} needs an upstream resource, e.g. "
                            f"{name}(cuda)")
        for req in info.required:
            if req not in seen:
                raise SpecError(self.spec, col, f"{name} needs {req}=...")
        return Spec(name, inner, tuple(kwargs))

    def value(self, resource, key, kind):
        tok_kind, text, col = self.take()
        if tok_kind == "str":
            text = text[1:-1]
        elif tok_kind not in ("name", "value"):
            raise SpecError(self.spec, col, f"expected a value for {key}")
        try:
            if kind == "size":
                return parse_bytes(text, key)
            if kind == "int":
                if not text.isdigit():
                    raise ValueError(f"{key} must be a non-negative integer, got {text!r}")
                return int(text)
            if kind == "bool":
                if text.lower() not in ("true", "false"):
                    raise ValueError(f"{key} must be true or false, got {text!r}")
                return text.lower() == "true"
            if text not in kind:
                raise ValueError(f"{key} must be one of {', '.join(kind)}; got {text!r}")
            return text
        except ValueError as exc:
            raise SpecError(self.spec, col, f"{resource}: {exc}") from None


def parse_spec(spec: str) -> Spec:
    """The :class:`Spec` tree of ``spec``; :class:`SpecError` (a ValueError) with a caret at
    the fault and the names that would be valid. Needs no GPU."""
    if not isinstance(spec, str):
        raise TypeError(f"spec must be a str, got {type(spec).__name__}")
    parser = _Parser(spec)
    tree = parser.resource()
    kind, text, col = parser.peek()
    if kind != "end":
        raise SpecError(spec, col, f"unexpected {text!r} after the resource")
    return tree


def _build(node: Spec):
    import rmm

    kw = dict(node.kwargs)
    inner = _build(node.inner) if node.inner else None
    name = node.name
    if name == "cuda":
        return rmm.mr.CudaMemoryResource()
    if name == "cuda_async":
        return rmm.mr.CudaAsyncMemoryResource(**kw)
    if name == "managed":
        return rmm.mr.ManagedMemoryResource()
    if name == "rmm_pool":
        return rmm.mr.PoolMemoryResource(inner, **kw)
    if name == "arena":
        return rmm.mr.ArenaMemoryResource(inner, **kw)
    if name == "limiting":
        return rmm.mr.LimitingResourceAdaptor(inner, kw["allocation_limit"])
    if name == "statistics":
        return rmm.mr.StatisticsResourceAdaptor(inner)
    import rmm_fences
    import rmm_fences.unsafe

    if name == "pool":
        return rmm_fences.StreamOrderedPoolMemoryResource(inner, **kw)
    if name == "sync_on_free":
        return rmm_fences.SyncOnFreeResourceAdaptor(inner, **kw)
    if name == "tracking":
        return rmm_fences.HazardTrackingResourceAdaptor(inner, **kw)
    if name == "naive_cache":
        return rmm_fences.unsafe.NaiveCachingMemoryResource(inner)
    if name == "vmm_unmap":
        return rmm_fences.unsafe.UnmappingVmmMemoryResource(**kw)
    raise AssertionError(name)  # parse_spec admits only known names


def compose(spec) -> object:
    """The ``rmm.mr.DeviceMemoryResource`` chain that ``spec`` (a str or a :class:`Spec`)
    describes, built on the current device, e.g.
    ``compose("sync_on_free(naive_cache(cuda_async), mode=deferred)")``."""
    return _build(spec if isinstance(spec, Spec) else parse_spec(spec))


class install:
    """Make a resource (or the chain of a spec) the current device resource of ``device``.

    Takes effect at once; used as a context manager it restores the previous resource on
    exit::

        with rmm_fences.install("pool(cuda_async)") as mr:
            ...
    """

    def __init__(self, spec_or_resource, device=None):
        import rmm

        if device is None:
            from rmm_fences._cuda import current_device

            device = current_device()
        self.device = device
        if isinstance(spec_or_resource, (str, Spec)):
            from rmm_fences._cuda import on_device

            with on_device(device):
                self.resource = compose(spec_or_resource)
        elif isinstance(spec_or_resource, rmm.mr.DeviceMemoryResource):
            self.resource = spec_or_resource
        else:
            raise TypeError("spec_or_resource must be a spec string, a Spec or an "
                            f"rmm.mr.DeviceMemoryResource, got {type(spec_or_resource).__name__}")
        self.previous = rmm.mr.get_per_device_resource(device)
        rmm.mr.set_per_device_resource(device, self.resource)

    def __enter__(self):
        return self.resource

    def __exit__(self, *exc):
        import rmm

        rmm.mr.set_per_device_resource(self.device, self.previous)
        return False
