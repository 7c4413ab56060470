# SPDX-License-Identifier: Apache-2.0
"""Resource specs without a GPU: what parses, and every error with its caret."""

import pytest

from rmm_fences.specs import RESOURCES, Spec, SpecError, parse_spec


@pytest.mark.parametrize(
    "text, expected",
    [
        ("cuda", Spec("cuda")),
        ("  cuda_async ", Spec("cuda_async")),
        (
            "cuda_async(release_threshold=1GiB)",
            Spec("cuda_async", None, (("release_threshold", 1 << 30),)),
        ),
        (
            "sync_on_free(naive_cache(cuda_async), mode=deferred)",
            Spec("sync_on_free", Spec("naive_cache", Spec("cuda_async")), (("mode", "deferred"),)),
        ),
        (
            "sync_on_free(cuda, max_batch_frees=4, max_batch_bytes=1MiB)",
            Spec(
                "sync_on_free", Spec("cuda"), (("max_batch_frees", 4), ("max_batch_bytes", 1 << 20))
            ),
        ),
        (
            "pool(cuda, initial_pool_size=512MiB, maximum_pool_size='2GB')",
            Spec(
                "pool",
                Spec("cuda"),
                (("initial_pool_size", 512 << 20), ("maximum_pool_size", 2 * 10**9)),
            ),
        ),
        (
            "limiting(rmm_pool(cuda, initial_pool_size=4096), allocation_limit=1 GiB)",
            Spec(
                "limiting",
                Spec("rmm_pool", Spec("cuda"), (("initial_pool_size", 4096),)),
                (("allocation_limit", 1 << 30),),
            ),
        ),
        (
            "tracking(statistics(arena(cuda)), on_hazard=raise, capture_stacks=true, nvtx=False)",
            Spec(
                "tracking",
                Spec("statistics", Spec("arena", Spec("cuda"))),
                (("on_hazard", "raise"), ("capture_stacks", True), ("nvtx", False)),
            ),
        ),
        (
            "vmm_unmap(reserve_size=8GiB, device=0)",
            Spec("vmm_unmap", None, (("reserve_size", 8 << 30), ("device", 0))),
        ),
        ("managed()", Spec("managed")),
        (
            "vmm_pool(remap_time_fraction=0.25)",
            Spec("vmm_pool", None, (("remap_time_fraction", 0.25),)),
        ),
    ],
)
def test_valid_specs(text, expected):
    assert parse_spec(text) == expected
    assert parse_spec(str(parse_spec(text))) == expected  # str() round-trips


@pytest.mark.parametrize(
    "text, message, column",
    [
        ("poool(cuda)", "unknown resource 'poool'; valid: arena, cuda, cuda_async", 0),
        ("pool(cuda_asink)", "unknown resource 'cuda_asink'", 5),
        ("sync_on_free(cuda, mode=fast)", "mode must be one of deferred, stream, device", 24),
        ("pool", "pool needs an upstream resource, e.g. pool(cuda)", 0),
        ("cuda(cuda)", "cuda takes no upstream resource", 5),
        ("limiting(cuda)", "limiting needs allocation_limit=", 0),
        ("pool(cuda, initial_pool_size=lots)", "initial_pool_size must be a size", 29),
        ("pool(cuda,", "pool( is never closed", 10),
        ("pool(cuda) x", "unexpected 'x' after the resource", 11),
        ("tracking(cuda, nvtx=maybe)", "nvtx must be true or false", 20),
        ("pool(cuda, foo=1)", "pool takes no argument 'foo'; valid: initial_pool_size", 11),
        ("statistics(cuda, mode=x)", "statistics takes no argument 'mode'; valid: none", 17),
        ("pool(initial_pool_size=1, cuda)", "the upstream resource comes first, once", 26),
        ("", "expected a resource name; valid:", 0),
        ("pool(cuda, initial_pool_size=1MiB, initial_pool_size=2MiB)", "given twice", 35),
        ("pool(cuda; x)", "unexpected character ';'", 9),
        ("vmm_unmap(device=gpu0)", "device must be a non-negative integer", 17),
        ("vmm_pool(remap_time_fraction=2)", "remap_time_fraction must be a number within", 29),
        ("vmm_pool(remap_time_fraction=nan)", "remap_time_fraction must be a number within", 29),
        ("pool(cuda, initial_pool_size=)", "expected a value for initial_pool_size", 29),
    ],
)
def test_errors_point_at_the_fault(text, message, column):
    with pytest.raises(SpecError) as err:
        parse_spec(text)
    assert message in str(err.value)
    assert err.value.column == column
    lines = str(err.value).splitlines()
    assert lines[-2] == f"  {text}" and lines[-1] == "  " + " " * column + "^"
    assert isinstance(err.value, ValueError)


def test_spec_must_be_a_string():
    with pytest.raises(TypeError, match="spec must be a str"):
        parse_spec(None)


def test_every_name_is_documented():
    assert set(RESOURCES) == {
        "cuda",
        "cuda_async",
        "managed",
        "rmm_pool",
        "arena",
        "limiting",
        "statistics",
        "pool",
        "stream_ordered_pool",
        "sync_on_free",
        "tracking",
        "naive_cache",
        "vmm_unmap",
        "vmm_pool",
    }
    assert all(kind.doc for kind in RESOURCES.values())


def test_every_resource_has_a_class_and_a_stream_order():
    import rmm

    from rmm_fences.specs import _OTHER_STREAM_ORDERED, INHERITS, _resolve

    for kind in RESOURCES.values():
        assert issubclass(_resolve(kind.cls), rmm.mr.DeviceMemoryResource), kind.name
        assert kind.stream_ordered in (True, False, INHERITS), kind.name
        assert kind.adaptor or kind.stream_ordered != INHERITS, kind.name
    assert set(_OTHER_STREAM_ORDERED.values()) <= {True, False, INHERITS}
