# SPDX-License-Identifier: Apache-2.0
"""The hypothesis settings of the state-machine tests of the C++ cores, and what the pool's
machines draw for its moves of pages."""

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

#: ``remap_time_fraction`` of a pool over a page arena: every move, a twentieth of the time
#: (with page calls so costly that the allowance runs out within a few growths), none.
REMAP_FRACTIONS = st.sampled_from([1.0, 0.05, 0.0])


def costly_moves(fraction: float) -> dict:
    """``HostStreamOrderedPool`` arguments: moves bounded by ``fraction``, 10 ms a page call
    (1 us a call of the pool), so the allowance decides on most growths past the first."""
    return {
        "arena_call_ns": 1_000,
        "arena_page_ns": 10_000_000,
        "arena_remap_time_fraction": fraction,
    }


def machine_settings(max_examples: int, steps: int) -> settings:
    """``max_examples`` programs of up to ``steps`` steps each, with no deadline (a step may run
    native threads) and no complaint about slow data generation."""
    return settings(
        max_examples=max_examples,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
