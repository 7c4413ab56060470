# SPDX-License-Identifier: Apache-2.0
"""rmm allocation logs (rmm_fences_bench.read_allocation_log / write_allocation_log / Trace)
and the replay engine of rmm_fences_bench.replay over a host resource (the host test harness):
no GPU needed, except the ``gpu`` tests at the end."""

import collections
import gzip
import io

import numpy as np
import pytest

from helpers.rmm_log import RMM_LOG
from rmm_fences_bench import Trace, read_allocation_log, replay, write_allocation_log


def test_reads_rmm_s_exact_format():
    t = read_allocation_log(io.StringIO(RMM_LOG))
    assert t.thread_ids == (2519617, 2519620)
    assert t.stream_handles == (0, 0x55D9F1A2B3C0)
    assert t.failed_allocations == 1  # the "allocate failure" line, left out
    assert t.dropped_frees == 1  # 0x7f3a4b000000 was never allocated in the log
    assert t.thread.tolist() == [0, 0, 1, 0, 0]
    assert t.action.tolist() == [0, 0, 1, 0, 1]  # allocate, allocate, free, allocate, free
    # 0x7f3a5c000000 freed, then allocated again: a new id
    assert t.id.tolist() == [0, 1, 0, 2, 2]
    assert t.size.tolist() == [1048576, 256, 1048576, 4096, 4096]
    assert t.stream.tolist() == [0, 1, 0, 1, 1]
    assert t.time[0] == 0
    assert t.time.tolist() == pytest.approx([0, 189e-6, 488e-6, 596e-6, 819e-6])
    assert t.start_time == pytest.approx(14 * 3600 + 3 * 60 + 27.519214)
    assert t.stats() == {
        "events": 5,
        "threads": 2,
        "streams": 2,
        "allocations": 3,
        "frees": 2,
        "leftovers": 1,
        "total_bytes": 1048576 + 256 + 4096,
        "peak_live_bytes": 1048576 + 256,
        "failed_allocations": 1,
        "dropped_frees": 1,
        "seconds": pytest.approx(819e-6),
    }


def test_reads_paths_gzip_and_binary_files(tmp_path):
    ref = read_allocation_log(io.StringIO(RMM_LOG))
    plain = tmp_path / "log.csv"
    plain.write_text(RMM_LOG)
    packed = tmp_path / "log.csv.gz"
    packed.write_bytes(gzip.compress(RMM_LOG.encode()))
    for source in (plain, str(packed), io.BytesIO(gzip.compress(RMM_LOG.encode())), packed):
        t = read_allocation_log(source)
        assert t.id.tolist() == ref.id.tolist() and t.dropped_frees == 1


def test_columns_by_header_name_and_without_header():
    lines = RMM_LOG.splitlines()
    # columns in another order, named by the header
    order = [5, 4, 3, 2, 1, 0]
    shuffled = "\n".join(",".join(line.split(",")[k] for k in order) for line in lines)
    t = read_allocation_log(io.StringIO(shuffled))
    assert t.size.tolist() == [1048576, 256, 1048576, 4096, 4096]
    # no header: rmm's order
    t = read_allocation_log(io.StringIO("\n".join(lines[1:])))
    assert t.id.tolist() == [0, 1, 0, 2, 2]
    with pytest.raises(ValueError, match="lacks the columns"):
        read_allocation_log(io.StringIO("Thread,Time,Action,Pointer,Size\n"))
    with pytest.raises(ValueError, match="line 2"):
        read_allocation_log(io.StringIO(lines[0] + "\n1,xx,allocate,0x10,8,0\n"))
    with pytest.raises(ValueError, match="unknown action"):
        read_allocation_log(io.StringIO(lines[0] + "\n1,00:00:00.000001,realloc,0x10,8,0\n"))


def test_times_past_midnight_keep_counting():
    log = (
        "Thread,Time,Action,Pointer,Size,Stream\n"
        "1,23:59:59.999000,allocate,0x10,8,0\n"
        "1,00:00:00.001000,free,0x10,8,0\n"
    )
    assert read_allocation_log(io.StringIO(log)).time.tolist() == pytest.approx([0, 0.002])


def test_round_trip(tmp_path):
    t = read_allocation_log(io.StringIO(RMM_LOG))
    for name in ("out.csv", "out.csv.gz"):
        path = tmp_path / name
        write_allocation_log(t, path)
        if name.endswith(".gz"):
            assert gzip.open(path, "rt").readline() == "Thread,Time,Action,Pointer,Size,Stream\n"
        back = read_allocation_log(path)
        for column in ("thread", "action", "id", "size", "stream"):
            assert getattr(back, column).tolist() == getattr(t, column).tolist(), column
        assert back.time == pytest.approx(t.time, abs=1e-6)
        assert back.thread_ids == t.thread_ids and back.stream_handles == t.stream_handles
        assert back.failed_allocations == 0 and back.dropped_frees == 0
    text = io.StringIO()
    write_allocation_log(t, text)
    first = text.getvalue().splitlines()[1]
    assert first == "2519617,14:03:27.519214,allocate,0x7f0000000000,1048576,0"


def test_writes_streams_as_rmm_does():
    # rmm writes a stream handle as a pointer: "0" for the default stream, "0x..." otherwise;
    # a written log reads back the same, and its lines have rmm's shape
    t = read_allocation_log(io.StringIO(RMM_LOG))
    text = io.StringIO()
    write_allocation_log(t, text)
    streams = [line.rsplit(",", 1)[1] for line in text.getvalue().splitlines()[1:]]
    assert streams == ["0", "0x55d9f1a2b3c0", "0", "0x55d9f1a2b3c0", "0x55d9f1a2b3c0"]
    # the bare hex that older readers of the format wrote reads the same
    bare = RMM_LOG.replace(",0x55d9f1a2b3c0", ",55d9f1a2b3c0")
    assert read_allocation_log(io.StringIO(bare)).stream_handles == (0, 0x55D9F1A2B3C0)


def test_trace_from_events_checks_lifetimes():
    t = Trace.from_events([(0, "allocate", 0, 64, 0), (1, "free", 0, None, 0)])
    assert t.size.tolist() == [64, 64] and t.threads == 2 and t.streams == 1
    with pytest.raises(ValueError, match="not live"):
        Trace.from_events([(0, "free", 0, 8, 0)])
    with pytest.raises(ValueError, match="allocated twice"):
        Trace.from_events([(0, "allocate", 0, 8, 0), (0, "allocate", 0, 8, 0)])
    with pytest.raises(ValueError, match="thread_ids"):
        Trace.from_events([(1, "allocate", 0, 8, 0)], threads=[7])


def synthetic(threads=4, per_thread=300, cross=True, seed=0, streams=2):
    """Each thread allocates and frees blocks of its own; with ``cross`` every third block is
    freed by the next thread (a cross-thread free) a few events later."""
    rng = np.random.default_rng(seed)
    events = []
    live = collections.defaultdict(list)  # thread -> ids it will free
    next_id = 0
    for _ in range(per_thread):
        for th in range(threads):
            if live[th] and rng.random() < 0.5:
                ident = live[th].pop(0)
                events.append((th, "free", ident, None, ident % streams))
            else:
                size = int(rng.integers(1, 1 << 16))
                events.append((th, "allocate", next_id, size, next_id % streams))
                owner = (th + 1) % threads if cross and next_id % 3 == 0 else th
                live[owner].append(next_id)
                next_id += 1
    for th in range(threads):  # free most of the rest, leave one per thread live
        for ident in live[th][1:]:
            events.append((th, "free", ident, None, ident % streams))
    return Trace.from_events(events)


def check_calls(trace, run, streams):
    """Every allocation made once with its size and stream, freed once with the same pointer,
    size and stream, after its allocation."""
    by_ptr = {}
    for seq, kind, ptr, size, stream in run["calls"]:
        if kind == "allocate":
            by_ptr.setdefault(ptr, []).append((seq, size, stream))
        else:
            seq0, size0, stream0 = by_ptr[ptr].pop()
            assert (size, stream) == (size0, stream0)
            assert seq > seq0
    assert all(not v for v in by_ptr.values()), "an allocation was never freed"
    allocs = [c for c in run["calls"] if c[1] == "allocate"]
    expected = collections.Counter(
        (int(s), streams[int(k)])
        for a, s, k in zip(trace.action, trace.size, trace.stream)
        if a == 0
    )
    assert collections.Counter((c[3], c[4]) for c in allocs) == expected


def test_replay_engine_frees_every_allocation_once():
    rmm_fences_testing = pytest.importorskip("rmm_fences_testing")
    t = synthetic()
    streams = [0, 0x5000]
    run = rmm_fences_testing.host_replay(t, streams=streams)
    check_calls(t, run, streams)
    assert run["allocations"] == t.allocations
    assert run["frees"] == t.frees
    assert run["leftovers"] == t.allocations - t.frees == 4
    assert run["errors"] == run["skipped_frees"] == 0
    assert run["thread_starts"] == t.threads
    assert 0 < run["peak_live_bytes"] <= t.total_bytes
    assert run["seconds"] > 0


def test_replay_engine_cross_thread_free_waits_for_its_allocation():
    rmm_fences_testing = pytest.importorskip("rmm_fences_testing")
    # thread 0 allocates slowly; thread 1's first event frees that block
    t = Trace.from_events(
        [(0, "allocate", 0, 4096, 0), (1, "free", 0, None, 0), (1, "allocate", 1, 8, 0)]
    )
    run = rmm_fences_testing.host_replay(t, slow_size=4096, slow_us=50_000)
    kinds = [(c[1], c[3]) for c in run["calls"]]
    assert kinds.index(("allocate", 4096)) < kinds.index(("free", 4096))
    check_calls(t, run, [100])
    assert run["leftovers"] == 1  # id 1, freed after the timing


def test_replay_engine_counts_errors_and_skips_their_frees():
    rmm_fences_testing = pytest.importorskip("rmm_fences_testing")
    t = Trace.from_events(
        [
            (0, "allocate", 0, 100, 0),
            (0, "allocate", 1, 666, 0),
            (1, "free", 1, None, 0),  # the failed one: skipped
            (1, "allocate", 2, 666, 0),  # fails too, never freed
            (1, "free", 0, None, 0),
        ]
    )
    run = rmm_fences_testing.host_replay(t, fail_size=666)
    assert run["errors"] == 2 and run["skipped_frees"] == 1
    assert run["allocations"] == 3 and run["frees"] == 1 and run["leftovers"] == 0
    assert [(c[1], c[3]) for c in run["calls"]] == [("allocate", 100), ("free", 100)]
    assert run["peak_live_bytes"] == 100


def test_replay_engine_repeats_from_scratch():
    rmm_fences_testing = pytest.importorskip("rmm_fences_testing")
    t = synthetic(threads=3, per_thread=100, seed=3)
    run = rmm_fences_testing.host_replay(t, streams=[7, 9], repeat=3)
    assert run["allocations"] == 3 * t.allocations
    assert run["frees"] == 3 * t.frees
    assert run["leftovers"] == 3 * (t.allocations - t.frees)
    assert run["thread_starts"] == 3 * t.threads
    allocs = sum(1 for c in run["calls"] if c[1] == "allocate")
    frees = sum(1 for c in run["calls"] if c[1] == "free")
    assert allocs == frees == 3 * t.allocations
    # the replay engine rejects a log it could not finish
    bad = Trace.from_events([(0, "allocate", 0, 8, 0)])
    with pytest.raises(ValueError, match="stream index out of range"):
        rmm_fences_testing.host_replay(bad, streams=[])


def test_replay_of_a_log_read_from_rmm_s_format():
    rmm_fences_testing = pytest.importorskip("rmm_fences_testing")
    t = read_allocation_log(io.StringIO(RMM_LOG))
    run = rmm_fences_testing.host_replay(t, streams=[0, 0x2000])
    check_calls(t, run, [0, 0x2000])
    assert run["leftovers"] == 1
    # only each thread's order and each free after its allocation are kept: thread 1 may free
    # the MiB before thread 0 allocates its 256 bytes (seen on a 16-core host), or after its 4096
    assert 1048576 <= run["peak_live_bytes"] <= 1048576 + 256 + 4096


KiB, MiB = 1 << 10, 1 << 20


def chunked_trace():
    """One thread: two 600 KiB blocks (the second does not fit in the first 1 MiB chunk's
    rest), one freed and its size allocated again (kept by the pool: no growth), then 3 MiB (a
    chunk of its own). Live at most: 600 KiB + 600 KiB + 3 MiB."""
    return Trace.from_events(
        [
            (0, "allocate", 0, 600 * KiB, 0),
            (0, "allocate", 1, 600 * KiB, 0),
            (0, "free", 0, None, 0),
            (0, "allocate", 2, 600 * KiB, 0),
            (0, "allocate", 3, 3 * MiB, 0),
            (0, "free", 1, None, 0),
            (0, "free", 2, None, 0),
            (0, "free", 3, None, 0),
        ]
    )


def chunk_sizes(run):
    return [c[3] for c in run["calls"] if c[1] == "allocate"]


def test_replay_engine_footprint_of_a_pool_that_grows_in_chunks():
    rmm_fences_testing = pytest.importorskip("rmm_fences_testing")
    t = chunked_trace()
    peak_live = 1200 * KiB + 3 * MiB
    assert t.peak_live_bytes == peak_live
    run = rmm_fences_testing.host_replay(t, pool_chunk_bytes=MiB, measure_footprint=True)
    assert chunk_sizes(run) == [MiB, MiB, 3 * MiB]  # what the pool drew from the upstream
    assert run["footprint_bytes"] == 5 * MiB
    assert run["trace_peak_live_bytes"] == run["peak_live_bytes"] == peak_live
    assert run["fragmentation"] == pytest.approx(5 * MiB / peak_live)
    assert run["errors"] == run["leftovers"] == 0
    # the same replay without the meter reports no footprint: the numbers above were measured
    bare = rmm_fences_testing.host_replay(t, pool_chunk_bytes=MiB)
    assert bare["footprint_bytes"] == 0 and bare["fragmentation"] == 0.0
    assert bare["trace_peak_live_bytes"] == peak_live


def test_replay_engine_footprint_over_repetitions_and_what_was_held_before():
    rmm_fences_testing = pytest.importorskip("rmm_fences_testing")
    t = chunked_trace()
    # the pool keeps its chunks: later repetitions reuse them, the footprint stays
    run = rmm_fences_testing.host_replay(t, repeat=3, pool_chunk_bytes=MiB, measure_footprint=True)
    assert chunk_sizes(run) == [MiB, MiB, 3 * MiB]
    assert run["footprint_bytes"] == 5 * MiB and run["allocations"] == 3 * t.allocations
    # a chunk made before the replay holds everything: the footprint is what the chain held,
    # not what it grew by
    run = rmm_fences_testing.host_replay(
        t, pool_chunk_bytes=MiB, pool_initial_bytes=8 * MiB, measure_footprint=True
    )
    assert chunk_sizes(run) == [8 * MiB]
    assert run["footprint_bytes"] == 8 * MiB
    assert run["fragmentation"] == pytest.approx(8 * MiB / (1200 * KiB + 3 * MiB))
    # a peak of the upstream before the replay is not the chain's footprint
    run = rmm_fences_testing.host_replay(
        t, pool_chunk_bytes=MiB, measure_footprint=True, spike_bytes=64 * MiB
    )
    assert chunk_sizes(run) == [64 * MiB, MiB, MiB, 3 * MiB]
    assert run["footprint_bytes"] == 5 * MiB


def test_replay_engine_footprint_without_a_pool_is_the_live_bytes():
    rmm_fences_testing = pytest.importorskip("rmm_fences_testing")
    t = chunked_trace()  # one thread: replayed in recorded order
    run = rmm_fences_testing.host_replay(t, measure_footprint=True)
    assert run["footprint_bytes"] == t.peak_live_bytes == run["trace_peak_live_bytes"]
    assert run["fragmentation"] == 1.0


def test_replay_engine_footprint_with_threads():
    rmm_fences_testing = pytest.importorskip("rmm_fences_testing")
    t = synthetic(threads=4, per_thread=400, seed=5)
    run = rmm_fences_testing.host_replay(t, pool_chunk_bytes=256 * KiB, measure_footprint=True)
    chunks = chunk_sizes(run)
    assert len(chunks) > 1
    # the pool returns nothing while it lives: its footprint is every chunk it took
    assert run["footprint_bytes"] == sum(chunks)
    # it holds every live block at once, rounded to 256 bytes
    assert run["footprint_bytes"] >= run["peak_live_bytes"] > 0
    assert run["trace_peak_live_bytes"] == t.peak_live_bytes
    assert run["fragmentation"] == pytest.approx(sum(chunks) / t.peak_live_bytes)


def test_trace_peak_live_bytes_counts_a_free_as_its_allocation():
    rmm_fences_testing = pytest.importorskip("rmm_fences_testing")
    # a log whose free names another size than its allocation (the replay frees the
    # allocation's size; so does the trace's peak)
    log = (
        "Thread,Time,Action,Pointer,Size,Stream\n"
        "1,00:00:00.000001,allocate,0x10,1000,0\n"
        "1,00:00:00.000002,free,0x10,10,0\n"
        "1,00:00:00.000003,allocate,0x20,500,0\n"
    )
    t = read_allocation_log(io.StringIO(log))
    assert t.peak_live_bytes == 1000
    run = rmm_fences_testing.host_replay(t, measure_footprint=True)
    assert run["trace_peak_live_bytes"] == 1000 == run["footprint_bytes"]
    for trace in (synthetic(seed=9), read_allocation_log(io.StringIO(RMM_LOG))):
        assert rmm_fences_testing.host_replay(trace)["trace_peak_live_bytes"] == (
            trace.peak_live_bytes
        )


def recorded_order(trace, streams):
    """The trace's events as the engine calls its resource, in recorded order: ``(kind, size,
    stream, id)``, a free of its allocation's size."""
    size_of = {}
    out = []
    for action, ident, size, stream in zip(trace.action, trace.id, trace.size, trace.stream):
        ident = int(ident)
        if action == 0:
            size_of[ident] = int(size)
        kind = "free" if action else "allocate"
        out.append((kind, size_of[ident], streams[int(stream)], ident))
    return out


def check_recorded_order(trace, run, streams, repeat=1):
    """The resource's calls, repetition by repetition: the trace's events in recorded order (a
    free with its allocation's pointer), then the frees of what the log leaves live. Returns each
    repetition's peak of live bytes as the resource saw it."""
    expected = recorded_order(trace, streams)
    leftovers = trace.allocations - trace.frees
    calls = run["calls"]
    assert len(calls) == repeat * (len(expected) + leftovers)
    peaks = []
    for rep in range(repeat):
        block = calls[rep * (len(expected) + leftovers) :][: len(expected) + leftovers]
        ptr_of, live, peak = {}, 0, 0
        for (_, kind, ptr, size, stream), (kind0, size0, stream0, ident) in zip(block, expected):
            assert (kind, size, stream) == (kind0, size0, stream0)
            if kind == "allocate":
                ptr_of[ident] = ptr
                live += size
                peak = max(peak, live)
            else:
                assert ptr == ptr_of.pop(ident)  # the block its allocation made
                live -= size
        assert sorted(c[2] for c in block[len(expected) :]) == sorted(ptr_of.values())
        assert all(c[1] == "free" for c in block[len(expected) :])
        peaks.append(peak)
    return peaks


def test_ordered_replay_calls_the_resource_in_recorded_order():
    rmm_fences_testing = pytest.importorskip("rmm_fences_testing")
    t = synthetic(threads=4, per_thread=300, seed=7)
    streams = [0, 0x5000]
    # an allocation of thread 0 sleeps first: free-running, the other threads would run ahead
    slow = int(t.size[(t.thread == 0) & (t.action == 0)][5])
    run = rmm_fences_testing.host_replay(
        t, streams=streams, repeat=3, slow_size=slow, slow_us=2000, ordered=True
    )
    peaks = check_recorded_order(t, run, streams, repeat=3)
    assert peaks == [t.peak_live_bytes] * 3  # every repetition, as the resource saw it
    assert run["peak_live_bytes"] == run["trace_peak_live_bytes"] == t.peak_live_bytes
    assert run["allocations"] == 3 * t.allocations and run["frees"] == 3 * t.frees
    assert run["errors"] == run["skipped_frees"] == 0
    assert run["thread_starts"] == 3 * t.threads
    # each repetition alone reports the trace's peak too
    for seed in range(5):
        t = synthetic(threads=3, per_thread=200, seed=seed)
        run = rmm_fences_testing.host_replay(t, ordered=True)
        assert run["peak_live_bytes"] == run["trace_peak_live_bytes"] == t.peak_live_bytes > 0


def skewed_trace():
    """Recorded: thread 0 allocates 64 B, then 1 MiB (the allocation the harness slows down),
    frees the MiB; then thread 1 frees the 64 B and allocates and frees 1 MiB. Peak: 1 MiB +
    64 B. Free-running, thread 1 waits only for the 64 B, and runs while thread 0 sleeps."""
    return Trace.from_events(
        [
            (0, "allocate", 0, 64, 0),
            (0, "allocate", 1, MiB, 0),
            (0, "free", 1, None, 0),
            (1, "free", 0, None, 0),
            (1, "allocate", 2, MiB, 0),
            (1, "free", 2, None, 0),
        ]
    )


def test_free_running_replay_leaves_the_recorded_order_ordered_does_not():
    rmm_fences_testing = pytest.importorskip("rmm_fences_testing")
    t = skewed_trace()
    assert t.peak_live_bytes == MiB + 64
    expected = [(kind, size) for kind, size, _, _ in recorded_order(t, [100])]
    # free-running: thread 1 frees the 64 B and makes its MiB while thread 0 sleeps before its
    # MiB, so the replayed peak is not the trace's (tried a few times: it is a race, which
    # thread 0's sleep of 100 ms makes thread 1 win)
    for _ in range(5):
        free = rmm_fences_testing.host_replay(t, slow_size=MiB, slow_us=100_000)
        if free["peak_live_bytes"] != free["trace_peak_live_bytes"]:
            break
    assert free["peak_live_bytes"] != free["trace_peak_live_bytes"] == MiB + 64
    assert [(c[1], c[3]) for c in free["calls"]] != expected
    # ordered: the same skew, the recorded order and peak
    run = rmm_fences_testing.host_replay(t, slow_size=MiB, slow_us=100_000, ordered=True)
    check_recorded_order(t, run, [100])
    assert run["peak_live_bytes"] == run["trace_peak_live_bytes"] == MiB + 64


def test_ordered_replay_goes_on_past_failed_allocations():
    rmm_fences_testing = pytest.importorskip("rmm_fences_testing")
    t = Trace.from_events(
        [
            (0, "allocate", 0, 100, 0),
            (0, "allocate", 1, 666, 0),
            (1, "free", 1, None, 0),  # the failed one: skipped, its turn passes
            (1, "allocate", 2, 666, 0),  # fails too, never freed
            (1, "free", 0, None, 0),
            (0, "allocate", 3, 50, 0),
            (1, "free", 3, None, 0),
        ]
    )
    run = rmm_fences_testing.host_replay(t, fail_size=666, ordered=True, repeat=2)
    assert run["errors"] == 4 and run["skipped_frees"] == 2
    assert run["allocations"] == 8 and run["frees"] == 4 and run["leftovers"] == 0
    once = [("allocate", 100), ("free", 100), ("allocate", 50), ("free", 50)]
    assert [(c[1], c[3]) for c in run["calls"]] == once * 2
    assert run["peak_live_bytes"] == 100 < run["trace_peak_live_bytes"] == 766


def one_thread(trace):
    """The same events, every one on thread 0: replayed in recorded order by construction."""
    return Trace.from_events(
        [
            (0, int(a), int(i), int(s), int(k))
            for a, i, s, k in zip(trace.action, trace.id, trace.size, trace.stream)
        ]
    )


def test_ordered_replay_footprint_is_deterministic():
    rmm_fences_testing = pytest.importorskip("rmm_fences_testing")
    t = synthetic(threads=4, per_thread=400, seed=5)
    slow = int(t.size[(t.thread == 1) & (t.action == 0)][3])
    options = dict(pool_chunk_bytes=256 * KiB, measure_footprint=True)
    # the footprint of the recorded order: one thread replays it
    reference = rmm_fences_testing.host_replay(one_thread(t), **options)
    assert reference["peak_live_bytes"] == t.peak_live_bytes
    for _ in range(4):
        run = rmm_fences_testing.host_replay(
            t, slow_size=slow, slow_us=2000, ordered=True, **options
        )
        assert chunk_sizes(run) == chunk_sizes(reference)  # the pool grew the same way
        assert run["footprint_bytes"] == reference["footprint_bytes"] > t.peak_live_bytes
        assert run["fragmentation"] == reference["fragmentation"]
        assert run["peak_live_bytes"] == t.peak_live_bytes


def test_ordered_must_be_a_bool():
    rmm_fences_testing = pytest.importorskip("rmm_fences_testing")
    for bad in (1, "yes", None):
        with pytest.raises(TypeError, match="ordered must be a bool"):
            rmm_fences_testing.host_replay(chunked_trace(), ordered=bad)


def test_with_footprint_puts_statistics_over_the_leaf():
    from rmm_fences.specs import SpecError, parse_spec

    from rmm_fences_bench import with_footprint

    cases = {
        "cuda": "statistics(cuda)",
        "pool(cuda)": "pool(statistics(cuda))",
        "rmm_pool(cuda, initial_pool_size=1GiB)": (
            f"rmm_pool(statistics(cuda), initial_pool_size={1 << 30})"
        ),
        "sync_on_free(rmm_pool(cuda, initial_pool_size=0), mode=deferred)": (
            "sync_on_free(rmm_pool(statistics(cuda), initial_pool_size=0), mode=deferred)"
        ),
        "tracking(pool(managed), on_hazard=record)": (
            "tracking(pool(statistics(managed)), on_hazard=record)"
        ),
        # the replay reads a cuda_async leaf's memory pool; a statistics leaf layer stays one
        "cuda_async": "cuda_async",
        "pool(cuda_async)": "pool(cuda_async)",
        "pool(statistics(cuda))": "pool(statistics(cuda))",
        "statistics(pool(cuda))": "statistics(pool(statistics(cuda)))",
    }
    for spec, expected in cases.items():
        assert with_footprint(spec) == expected, spec
        assert with_footprint(parse_spec(spec)) == expected, spec
        parse_spec(expected)  # a valid spec
    with pytest.raises(SpecError, match="unknown resource"):
        with_footprint("pool(cudaa)")


def test_footprint_layer_is_the_bottom_of_the_chain():
    import rmm

    from rmm_fences_bench import footprint_layer

    cuda = rmm.mr.CudaMemoryResource()  # none of these constructors calls CUDA
    stats = rmm.mr.StatisticsResourceAdaptor(cuda)
    assert footprint_layer(cuda) == ("none", None)
    assert footprint_layer(stats) == ("statistics", stats)
    top = rmm.mr.TrackingResourceAdaptor(stats)
    assert footprint_layer(top) == ("statistics", stats)
    lower = rmm.mr.StatisticsResourceAdaptor(cuda)
    assert footprint_layer(rmm.mr.StatisticsResourceAdaptor(lower)) == ("statistics", lower)
    # a statistics adaptor higher up counts what the layers under it were asked for
    higher = rmm.mr.StatisticsResourceAdaptor(rmm.mr.TrackingResourceAdaptor(cuda))
    assert footprint_layer(higher) == ("none", None)


def test_replay_stats_stub_lists_the_engine_s_fields():
    import ast
    import pathlib

    from rmm_fences_bench import _loops

    rmm_fences_testing = pytest.importorskip("rmm_fences_testing")
    stub = ast.parse((pathlib.Path(_loops.__file__).parent / "_loops.pyi").read_text())
    (stats,) = [n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "ReplayStats"]
    fields = {n.target.id for n in stats.body if isinstance(n, ast.AnnAssign)}
    # the engine's result struct, as the harness returns it, and what replay() adds
    engine = set(rmm_fences_testing.host_replay(chunked_trace())) - {"thread_starts", "calls"}
    assert fields == engine | {"allocations_per_s", "footprint_source"}


def test_replay_validates_before_any_cuda_call():
    import rmm

    mr = rmm.mr.CudaMemoryResource()
    t = synthetic(threads=2, per_thread=10)
    with pytest.raises(ValueError, match="repeat must be positive"):
        replay(mr, t, repeat=0)
    with pytest.raises(ValueError, match="no event"):
        replay(mr, Trace.from_events([]))
    with pytest.raises(ValueError, match="one stream per recorded stream"):
        replay(mr, t, streams=[None])
    for bad in (1, "yes", None):
        with pytest.raises(TypeError, match="ordered must be a bool"):
            replay(mr, t, ordered=bad)


def test_replay_reaches_the_native_call_without_a_gpu():
    import rmm

    from rmm_fences._cuda import device_count

    if device_count() > 0:
        pytest.skip("a GPU is present: test_replay_on_the_gpu covers the call")
    # the trace's columns pass into C++ (read-only arrays as const memoryviews); the first
    # CUDA call (cudaGetDevice) then fails
    t = Trace.from_events([(0, "allocate", 0, 8, 0), (1, "free", 0, None, 0)])
    with pytest.raises(RuntimeError, match="CUDA error"):
        replay(rmm.mr.CudaMemoryResource(), t)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["stream_ordered_pool", "rmm_pool"])
def test_replay_on_the_gpu(kind):
    import rmm
    from rmm.pylibrmm.stream import Stream

    from rmm_fences import StreamOrderedPoolMemoryResource

    if kind == "stream_ordered_pool":
        mr = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource())
    else:
        mr = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=2**28)
    t = synthetic(threads=4, per_thread=2000, streams=3)
    stats = replay(mr, t, repeat=2)
    assert stats["errors"] == 0 and stats["skipped_frees"] == 0
    assert stats["allocations"] == 2 * t.allocations
    assert stats["frees"] == 2 * t.frees
    assert stats["leftovers"] == 2 * (t.allocations - t.frees)
    assert 0 < stats["peak_live_bytes"] <= t.total_bytes
    assert stats["seconds"] > 0
    # sane: faster than 10k and slower than 1e9 allocations + frees per second on any host
    assert 1e4 < stats["allocations_per_s"] < 1e9, stats
    # the caller's streams, the legacy default stream among them
    stats = replay(mr, t, streams=[None, Stream(), None])
    assert stats["errors"] == 0
