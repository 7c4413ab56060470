# SPDX-License-Identifier: Apache-2.0
"""Resource chains from one-line specs, and using them as the current device resource.

>>> from rmm_fences.specs import parse_spec
>>> parse_spec("sync_on_free(naive_cache(cuda_async), mode=deferred)")
Spec(name='sync_on_free', inner=Spec(name='naive_cache', inner=Spec(name='cuda_async', ...

Grammar: ``name`` or ``name(inner, key=value, ...)``; the inner resource comes first and only
adaptors take one. Sizes take ints or strings such as ``512MiB`` or ``2GB``. ``parse_spec``
needs no GPU; ``compose`` builds the resources (on the current device).

The two pools: ``stream_ordered_pool`` is rmm_fences' ``StreamOrderedPoolMemoryResource``, and
``pool`` its shorthand (the same resource: a spec written with it keeps its meaning);
``vmm_pool`` is the same pool over device pages it maps itself (``VmmPoolMemoryResource``, no
upstream); ``rmm_pool`` is rmm's ``PoolMemoryResource``.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from rmm_fences._sizes import parse_bytes

if TYPE_CHECKING:  # parse_spec needs no rmm
    import rmm

__all__ = ["Spec", "SpecError", "RESOURCES", "parse_spec", "compose", "use_resource"]


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
        parts = ([str(self.inner)] if self.inner else []) + [f"{k}={v}" for k, v in self.kwargs]
        return f"{self.name}({', '.join(parts)})" if parts else self.name


#: The ``stream_ordered`` of an adaptor that passes each call to its upstream: the upstream's
#: answer.
INHERITS = "inherits from upstream"


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Kind:
    """One resource a spec can name, and everything rmm_fences knows about it."""

    name: str
    cls: str
    """Dotted path of its class, imported when first needed (``parse_spec`` needs no rmm)."""
    adaptor: bool
    """Takes an upstream resource (the ``inner`` of its spec)."""
    params: dict
    """Keyword arguments: name -> ``"size"`` | ``"int"`` | ``"bool"`` | ``"fraction"`` (a
    number within [0, 1]) | tuple of choices."""
    stream_ordered: bool | str
    """Whether a block it frees is safe to hand out again while work queued before the free
    may still use it: ``True`` (reuse ordered by stream, or a free that synchronizes),
    ``False``, or :data:`INHERITS`. ``HazardTrackingResourceAdaptor`` infers its
    ``upstream_stream_ordered`` from this."""
    doc: str
    required: tuple = ()
    aliases: tuple = ()
    """Other names of it in specs (shorthands), each a key of :data:`RESOURCES`."""
    factory: Callable | None = None
    """``factory(cls, upstream, kwargs)`` builds it; default ``cls(upstream, **kwargs)`` for an
    adaptor, ``cls(**kwargs)`` otherwise."""

    def build(self, upstream, kwargs: dict):
        cls = _resolve(self.cls)
        if self.factory is not None:
            return self.factory(cls, upstream, kwargs)
        return cls(upstream, **kwargs) if self.adaptor else cls(**kwargs)


_SIZES = {"initial_pool_size": "size", "maximum_pool_size": "size"}

#: The resources of specs, by name (a resource's aliases included).
RESOURCES = {
    name: kind
    for kind in (
        _Kind(
            name="cuda",
            cls="rmm.mr.CudaMemoryResource",
            adaptor=False,
            params={},
            stream_ordered=True,
            doc="rmm CudaMemoryResource (cudaMalloc/cudaFree)",
        ),
        _Kind(
            name="cuda_async",
            cls="rmm.mr.CudaAsyncMemoryResource",
            adaptor=False,
            params={"initial_pool_size": "size", "release_threshold": "size"},
            stream_ordered=True,
            doc="rmm CudaAsyncMemoryResource (cudaMallocAsync)",
        ),
        _Kind(
            name="managed",
            cls="rmm.mr.ManagedMemoryResource",
            adaptor=False,
            params={},
            stream_ordered=True,
            doc="rmm ManagedMemoryResource",
        ),
        _Kind(
            name="rmm_pool",
            cls="rmm.mr.PoolMemoryResource",
            adaptor=True,
            params=_SIZES,
            stream_ordered=True,
            doc="rmm PoolMemoryResource",
        ),
        _Kind(
            name="arena",
            cls="rmm.mr.ArenaMemoryResource",
            adaptor=True,
            params={"arena_size": "size"},
            stream_ordered=True,
            doc="rmm ArenaMemoryResource",
        ),
        _Kind(
            name="limiting",
            cls="rmm.mr.LimitingResourceAdaptor",
            adaptor=True,
            params={"allocation_limit": "size"},
            stream_ordered=INHERITS,
            required=("allocation_limit",),
            factory=lambda cls, upstream, kw: cls(upstream, kw["allocation_limit"]),
            doc="rmm LimitingResourceAdaptor",
        ),
        _Kind(
            name="statistics",
            cls="rmm.mr.StatisticsResourceAdaptor",
            adaptor=True,
            params={},
            stream_ordered=INHERITS,
            doc="rmm StatisticsResourceAdaptor",
        ),
        _Kind(
            name="stream_ordered_pool",
            cls="rmm_fences.StreamOrderedPoolMemoryResource",
            adaptor=True,
            params={**_SIZES, "maximum_growth_size": "size"},
            stream_ordered=True,
            aliases=("pool",),
            doc="rmm_fences StreamOrderedPoolMemoryResource (shorthand: pool)",
        ),
        _Kind(
            name="vmm_pool",
            cls="rmm_fences.VmmPoolMemoryResource",
            adaptor=False,
            params={**_SIZES, "reserve_size": "size", "remap_time_fraction": "fraction"},
            stream_ordered=True,
            doc="rmm_fences VmmPoolMemoryResource (the pool over device pages it maps itself)",
        ),
        _Kind(
            name="sync_on_free",
            cls="rmm_fences.SyncOnFreeResourceAdaptor",
            adaptor=True,
            params={
                "mode": ("deferred", "stream", "device"),
                "max_pending_bytes": "size",
                "max_batch_frees": "int",
                "max_batch_bytes": "size",
                "reuse_on_stream": "bool",
            },
            stream_ordered=True,
            doc="rmm_fences SyncOnFreeResourceAdaptor",
        ),
        _Kind(
            name="tracking",
            cls="rmm_fences.HazardTrackingResourceAdaptor",
            adaptor=True,
            params={
                "on_hazard": ("warn", "raise", "record"),
                "capture_stacks": "bool",
                "upstream_stream_ordered": "bool",
                "nvtx": "bool",
            },
            stream_ordered=INHERITS,
            doc="rmm_fences HazardTrackingResourceAdaptor",
        ),
        _Kind(
            name="naive_cache",
            cls="rmm_fences.unsafe.NaiveCachingMemoryResource",
            adaptor=True,
            params={},
            stream_ordered=False,
            doc="rmm_fences.unsafe NaiveCachingMemoryResource",
        ),
        _Kind(
            name="vmm_unmap",
            cls="rmm_fences.unsafe.UnmappingVmmMemoryResource",
            adaptor=False,
            params={"reserve_size": "size", "device": "int"},
            stream_ordered=False,
            doc="rmm_fences.unsafe UnmappingVmmMemoryResource",
        ),
    )
    for name in (kind.name, *kind.aliases)
}

#: rmm resources that specs do not name, with their ``stream_ordered`` (see :class:`_Kind`).
#: Any other resource (callback resources, ...) counts as not stream-ordered.
_OTHER_STREAM_ORDERED = {
    "rmm.mr.CudaAsyncViewMemoryResource": True,
    "rmm.mr.FixedSizeMemoryResource": True,
    "rmm.mr.BinningMemoryResource": True,
    "rmm.mr.LoggingResourceAdaptor": INHERITS,
    "rmm.mr.TrackingResourceAdaptor": INHERITS,
    "rmm.mr.FailureCallbackResourceAdaptor": INHERITS,
}


def _resolve(path: str):
    """The object at dotted ``path`` (``module.attr``); None when the module lacks it."""
    module, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module), attr, None)


_STREAM_ORDER_BY_TYPE = None


def _stream_ordered(mr) -> bool:
    """Whether ``mr`` orders reuse by stream or frees synchronously, by :data:`RESOURCES` and
    :data:`_OTHER_STREAM_ORDERED`, following adaptors that inherit their upstream's answer."""
    global _STREAM_ORDER_BY_TYPE
    if _STREAM_ORDER_BY_TYPE is None:
        answers = {kind.cls: kind.stream_ordered for kind in RESOURCES.values()}
        answers.update(_OTHER_STREAM_ORDERED)
        _STREAM_ORDER_BY_TYPE = tuple(
            (cls, answer)
            for cls, answer in ((_resolve(p), a) for p, a in answers.items())
            if cls is not None
        )
    while True:
        answer = next((a for cls, a in _STREAM_ORDER_BY_TYPE if isinstance(mr, cls)), False)
        if answer != INHERITS:
            return answer
        mr = mr.get_upstream()


_TOKEN = re.compile(
    r"\s*(?:(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<value>[0-9][0-9.]*\s*[A-Za-z]*)"
    r"|(?P<str>'[^']*'|\"[^\"]*\")|(?P<punct>[(),=]))"
)


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
            raise SpecError(
                self.spec, col, f"expected {text!r}, got {got!r}" if got else f"expected {text!r}"
            )

    def resource(self) -> Spec:
        kind, name, col = self.take()
        if kind != "name":
            raise SpecError(self.spec, col, "expected a resource name; valid: " + _names(RESOURCES))
        if name not in RESOURCES:
            raise SpecError(
                self.spec, col, f"unknown resource {name!r}; valid: {_names(RESOURCES)}"
            )
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
                        raise SpecError(
                            self.spec, acol, f"{name} takes no argument {text!r}; valid: {valid}"
                        )
                    if text in seen:
                        raise SpecError(self.spec, acol, f"{text!r} given twice")
                    seen.add(text)
                    kwargs.append((text, self.value(name, text, info.params[text])))
                else:
                    if kwargs or inner is not None:
                        raise SpecError(self.spec, acol, "the upstream resource comes first, once")
                    if not info.adaptor:
                        raise SpecError(self.spec, acol, f"{name} takes no upstream resource")
                    inner = self.resource()
            self.take()
        if info.adaptor and inner is None:
            raise SpecError(self.spec, col, f"{name} needs an upstream resource, e.g. {name}(cuda)")
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
            if kind == "fraction":
                return _fraction(text, key)
            if kind == "bool":
                if text.lower() not in ("true", "false"):
                    raise ValueError(f"{key} must be true or false, got {text!r}")
                return text.lower() == "true"
            if text not in kind:
                raise ValueError(f"{key} must be one of {', '.join(kind)}; got {text!r}")
            return text
        except ValueError as exc:
            raise SpecError(self.spec, col, f"{resource}: {exc}") from None


def _fraction(text: str, key: str) -> float:
    """``text`` as a number within [0, 1]; ValueError naming ``key`` otherwise."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{key} must be a number within [0, 1], got {text!r}")
    return value


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
    inner = _build(node.inner) if node.inner else None
    return RESOURCES[node.name].build(inner, dict(node.kwargs))


def compose(spec) -> object:
    """The ``rmm.mr.DeviceMemoryResource`` chain that ``spec`` (a str or a :class:`Spec`)
    describes, built on the current device, e.g.
    ``compose("sync_on_free(naive_cache(cuda_async), mode=deferred)")``."""
    return _build(spec if isinstance(spec, Spec) else parse_spec(spec))


class use_resource:
    """Make a resource (or the chain of a spec) the current device resource of ``device``.

    Takes effect at once, as ``rmm.mr.set_per_device_resource(device, mr)`` would; used as a
    context manager it restores the previous resource on exit::

        with rmm_fences.use_resource("pool(cuda_async)") as mr:
            ...  # rmm's current device resource inside the block

    Parameters
    ----------
    spec_or_resource : str, Spec or rmm.mr.DeviceMemoryResource
        A spec of :func:`compose` (built on ``device``) or a resource.
    device : int, optional
        The device whose current resource it becomes (default: the current device).

    Attributes: ``resource`` (what was made current), ``previous`` (what the exit restores),
    ``device``. (PyTorch's allocator has its own, one-way
    ``rmm_fences.allocators.torch.install``.)
    """

    def __init__(
        self,
        spec_or_resource: str | Spec | rmm.mr.DeviceMemoryResource,
        *,
        device: int | None = None,
    ) -> None:
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
            raise TypeError(
                "spec_or_resource must be a spec string, a Spec or an "
                f"rmm.mr.DeviceMemoryResource, got {type(spec_or_resource).__name__}"
            )
        self.previous = rmm.mr.get_per_device_resource(device)
        rmm.mr.set_per_device_resource(device, self.resource)

    def __enter__(self):
        return self.resource

    def __exit__(self, *exc):
        import rmm

        rmm.mr.set_per_device_resource(self.device, self.previous)
        return False
