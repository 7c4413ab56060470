# SPDX-License-Identifier: Apache-2.0
"""The two pools of the spec language, without a GPU: ``stream_ordered_pool`` names rmm_fences'
pool and ``pool`` is its shorthand (a spec written with it keeps its meaning); ``rmm_pool`` is
rmm's."""

from rmm_fences.specs import RESOURCES, Spec, parse_spec


def test_pool_is_the_shorthand_of_stream_ordered_pool():
    kind = RESOURCES["stream_ordered_pool"]
    assert RESOURCES["pool"] is kind
    assert kind.name == "stream_ordered_pool" and kind.aliases == ("pool",)
    assert kind.cls == "rmm_fences.StreamOrderedPoolMemoryResource"
    assert "shorthand: pool" in kind.doc


def test_rmm_pool_is_rmms_pool():
    assert RESOURCES["rmm_pool"].cls == "rmm.mr.PoolMemoryResource"
    assert RESOURCES["rmm_pool"].aliases == ()


def test_each_name_parses_as_written():
    for name in ("pool", "stream_ordered_pool"):
        text = f"{name}(cuda, maximum_growth_size=8MiB)"
        assert parse_spec(text) == Spec(name, Spec("cuda"), (("maximum_growth_size", 8 << 20),))
        assert str(parse_spec(text)) == f"{name}(cuda, maximum_growth_size={8 << 20})"


def test_every_alias_is_a_name_of_its_kind_only():
    for name, kind in RESOURCES.items():
        assert name == kind.name or name in kind.aliases
        for alias in kind.aliases:
            assert RESOURCES[alias] is kind
