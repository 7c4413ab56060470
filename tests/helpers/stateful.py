# SPDX-License-Identifier: Apache-2.0
"""The hypothesis settings of the state-machine tests of the C++ cores."""

from hypothesis import HealthCheck, settings


def machine_settings(max_examples: int, steps: int) -> settings:
    """``max_examples`` programs of up to ``steps`` steps each, with no deadline (a step may run
    native threads) and no complaint about slow data generation."""
    return settings(
        max_examples=max_examples,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
