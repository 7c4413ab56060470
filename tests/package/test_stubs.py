# SPDX-License-Identifier: Apache-2.0
"""The typed stub memory_resource.pyi against the compiled module: no GPU needed.

Every public class, method and property of rmm_fences._lib.memory_resource is in the stub, with
the same kind (property or method), and the stub names nothing the module lacks; the stats
TypedDicts list the fields of the C++ counters (_cores.pxd) that the ``stats`` properties
return.
"""

import ast
import inspect
import pathlib
import re

import pytest

from rmm_fences._lib import memory_resource as mod

from helpers.paths import ROOT

LIB = pathlib.Path(mod.__file__).parent
STUB = ast.parse((LIB / "memory_resource.pyi").read_text())


def _public(name):
    return not name.startswith("_")


def module_api():
    """{class name: {member: "property" | "method"}} and the public functions."""
    classes, functions = {}, set()
    for name, obj in vars(mod).items():
        if not _public(name) or getattr(obj, "__module__", None) != mod.__name__:
            continue
        if inspect.isclass(obj):
            members = {}
            for klass in reversed(obj.__mro__):  # our private cdef bases, then the class
                if klass.__module__ != mod.__name__:
                    continue  # rmm's members are rmm's stub's business
                for member, value in vars(klass).items():
                    if _public(member):
                        members[member] = "method" if callable(value) else "property"
            classes[name] = members
        elif callable(obj):
            functions.add(name)
    return classes, functions


def _is_typed_dict(node):
    return any(isinstance(b, ast.Name) and b.id == "TypedDict" for b in node.bases)


def stub_api():
    classes, functions, typed_dicts = {}, set(), {}
    for node in STUB.body:
        if isinstance(node, ast.ClassDef) and _is_typed_dict(node):
            typed_dicts[node.name] = [
                n.target.id for n in node.body if isinstance(n, ast.AnnAssign)
            ]
        elif isinstance(node, ast.ClassDef):
            members = {}
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and _public(item.name):
                    is_property = any(
                        isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list
                    )
                    members[item.name] = "property" if is_property else "method"
            classes[node.name] = members
        elif isinstance(node, ast.FunctionDef) and _public(node.name):
            functions.add(node.name)
    return classes, functions, typed_dicts


def test_the_stub_lists_the_public_classes_and_functions():
    classes, functions = module_api()
    stub_classes, stub_functions, _ = stub_api()
    assert sorted(classes) == sorted(stub_classes)
    assert functions == stub_functions
    assert {
        "SyncOnFreeResourceAdaptor",
        "StreamOrderedPoolMemoryResource",
        "HazardTrackingResourceAdaptor",
        "NaiveCachingMemoryResource",
        "UnmappingVmmMemoryResource",
    } <= set(classes)


@pytest.mark.parametrize("name", sorted(module_api()[0]))
def test_the_stub_lists_each_member_with_its_kind(name):
    assert module_api()[0][name] == stub_api()[0][name]


def test_the_stub_bases_are_the_module_bases():
    for node in STUB.body:
        if isinstance(node, ast.ClassDef) and not _is_typed_dict(node):
            cls = getattr(mod, node.name)
            bases = {b.id for b in node.bases}
            assert bases == {b.__name__ for b in cls.__mro__[1:]} & bases, node.name
            assert len(bases) == 1


def _pxd_structs():
    text = (LIB / "_cores.pxd").read_text() if (LIB / "_cores.pxd").exists() else None
    if text is None:  # an installed package holds no .pxd: read the source tree's
        text = (ROOT / "src/rmm_fences/_lib/_cores.pxd").read_text()
    structs = {}
    for m in re.finditer(r"cdef struct (\w+):\n((?:        .*\n)+)", text):
        structs[m.group(1)] = [line.split()[-1] for line in m.group(2).splitlines()]
    return structs


@pytest.mark.parametrize(
    "typed_dict, struct, extra",
    [
        ("SyncOnFreeStats", "sync_on_free_stats", []),
        ("StreamOrderedPoolStats", "stream_ordered_pool_stats", []),
        ("HazardTrackerStats", "hazard_tracker_stats", ["pending_checks"]),
    ],
)
def test_the_stats_typed_dicts_follow_the_cpp_counters(typed_dict, struct, extra):
    assert stub_api()[2][typed_dict] == _pxd_structs()[struct] + extra


def test_the_torch_stub_lists_the_module_functions_and_counters():
    from rmm_fences._lib import _torch

    stub = ast.parse((LIB / "_torch.pyi").read_text())
    functions = {n.name for n in stub.body if isinstance(n, ast.FunctionDef)}
    names = {
        n.target.id
        for n in stub.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    module_functions = {
        name
        for name, obj in vars(_torch).items()
        if _public(name) and callable(obj) and getattr(obj, "__module__", None) == _torch.__name__
    }
    assert functions == module_functions
    assert names == {"ALLOC_FN", "FREE_FN", "RECORD_STREAM_FN", "POOL_ALLOC_FN", "POOL_FREE_FN"}
    counters = {
        n.name: [i.target.id for i in n.body if isinstance(i, ast.AnnAssign)]
        for n in stub.body
        if isinstance(n, ast.ClassDef)
    }
    assert counters["TorchAllocatorStats"] == _pxd_structs()["torch_allocator_stats"]
    assert counters["EntryPoints"] == [
        "alloc",
        "free",
        "record_stream",
        "pool_alloc",
        "pool_free",
    ]
