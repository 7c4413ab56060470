# SPDX-License-Identifier: Apache-2.0
"""HazardTrackingResourceAdaptor's arguments, inference and reports: no GPU needed."""

import json

import pytest
import rmm

from rmm_fences import (
    HazardError,
    HazardTrackingResourceAdaptor,
    StreamOrderedPoolMemoryResource,
    SyncOnFreeResourceAdaptor,
)
from rmm_fences._hazards import HazardRecord, describe
from rmm_fences.unsafe import NaiveCachingMemoryResource


def cuda():
    return rmm.mr.CudaMemoryResource()


@pytest.mark.parametrize(
    "make, ordered",
    [
        (lambda: cuda(), True),
        (lambda: NaiveCachingMemoryResource(cuda()), False),
        (lambda: SyncOnFreeResourceAdaptor(NaiveCachingMemoryResource(cuda())), True),
        (lambda: StreamOrderedPoolMemoryResource(cuda()), True),
        (lambda: rmm.mr.StatisticsResourceAdaptor(NaiveCachingMemoryResource(cuda())), False),
        (lambda: rmm.mr.LimitingResourceAdaptor(cuda(), 1 << 30), True),
        (lambda: HazardTrackingResourceAdaptor(NaiveCachingMemoryResource(cuda())), False),
        (lambda: rmm.mr.CallbackMemoryResource(lambda n, s: 0, lambda p, n, s: None), False),
    ],
)
def test_upstream_stream_ordered_is_inferred(make, ordered):
    from rmm_fences._lib.memory_resource import _infer_stream_ordered

    assert _infer_stream_ordered(make()) is ordered


def test_inference_is_overridable_and_shown():
    t = HazardTrackingResourceAdaptor(
        NaiveCachingMemoryResource(cuda()), upstream_stream_ordered=True, on_hazard="record"
    )
    assert t.upstream_stream_ordered is True and t.on_hazard == "record"
    assert "upstream_stream_ordered=True" in repr(t)
    assert HazardTrackingResourceAdaptor(cuda()).upstream_stream_ordered is True


@pytest.mark.parametrize("on_hazard", ["Warn", "ignore", None, 1])
def test_on_hazard_names_the_valid_values(on_hazard):
    with pytest.raises(ValueError, match="on_hazard must be one of 'warn', 'raise', 'record'"):
        HazardTrackingResourceAdaptor(cuda(), on_hazard=on_hazard)


@pytest.mark.parametrize("name", ["capture_stacks", "nvtx", "report_at_exit"])
def test_flags_must_be_bools(name):
    with pytest.raises(TypeError, match=f"{name} must be a bool"):
        HazardTrackingResourceAdaptor(cuda(), **{name: "yes"})


def test_upstream_stream_ordered_type():
    with pytest.raises(TypeError, match="upstream_stream_ordered must be None"):
        HazardTrackingResourceAdaptor(cuda(), upstream_stream_ordered="no")


def test_arguments_after_the_upstream_are_keyword_only():
    with pytest.raises(TypeError):
        HazardTrackingResourceAdaptor(cuda(), True)


def test_record_stream_of_an_unknown_pointer_names_the_argument():
    t = HazardTrackingResourceAdaptor(cuda())
    with pytest.raises(ValueError, match="buffer_or_ptr .* is not the start of a live"):
        t.record_stream(0x1000, None)
    with pytest.raises(TypeError, match="buffer_or_ptr must be an int pointer"):
        t.record_stream("0x1000", None)


def test_an_empty_tracker_reports_nothing():
    t = HazardTrackingResourceAdaptor(cuda())
    t.check()
    assert t.hazards == [] and t.outstanding() == [] and t.stream_bytes == {}
    text = t.report()
    assert "hazards: none" in text and "CudaMemoryResource" in text
    data = json.loads(t.report(format="json"))
    assert data["hazards"] == [] and data["leaks"] == [] and data["allocated_bytes"] == 0
    with pytest.raises(ValueError, match="format must be 'text' or 'json'"):
        t.report(format="xml")


def test_hazard_error_lists_the_messages():
    h = HazardRecord(
        "double_free", 0x1000, 256, 0, (), describe("double_free", 0x1000, 256, 0, 0, ())
    )
    err = HazardError([h] * 12)
    assert "double_free" in str(err) and "and 2 more" in str(err) and len(err.hazards) == 12
