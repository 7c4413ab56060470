"""Which stream-identity calls does a CUDA stream capture tolerate? (run on the GPU host)"""

import cupy
from cuda.bindings import driver as cu

cu.cuInit(0)


def status(s):
    err, st = cu.cuStreamIsCapturing(s.ptr)
    return st.name


for mode_name in ("global", "thread_local", "relaxed"):
    for relax in (False, True):
        s = cupy.cuda.Stream(non_blocking=True)
        mode = {
            "global": cupy.cuda.runtime.streamCaptureModeGlobal,
            "thread_local": cupy.cuda.runtime.streamCaptureModeThreadLocal,
            "relaxed": cupy.cuda.runtime.streamCaptureModeRelaxed,
        }[mode_name]
        s.begin_capture(mode=mode)
        if relax:
            err, prev = cu.cuThreadExchangeStreamCaptureMode(
                cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
            )
        err_id, sid = cu.cuStreamGetId(s.ptr)
        if relax:
            cu.cuThreadExchangeStreamCaptureMode(prev)
        st = status(s)
        err_info = cu.cuStreamGetCaptureInfo(s.ptr)[0]
        try:
            s.end_capture()
            ended = "ok"
        except Exception as exc:
            ended = type(exc).__name__
        print(
            f"capture={mode_name:<12} relaxed_scope={relax!s:<5} cuStreamGetId={err_id.name:<40} "
            f"status_after={st:<40} end_capture={ended}"
        )


# Queries of a stream that is NOT capturing, made while a global-mode capture is under way on
# another stream, in another thread or in this one: does the query fail, and does the capture
# survive? (The pool wraps cuStreamGetId in a relaxed-mode exchange for this case.)
def status_and_end(s):
    """The capture status of ``s``, then how ending its capture went."""
    out = {"status": status(s)}
    try:
        s.end_capture()
        out["end"] = "ok"
    except Exception as exc:
        out["end"] = type(exc).__name__
    return out


def other_stream_query(where, query, relax):
    import threading

    victim = cupy.cuda.Stream(non_blocking=True)
    queried = cupy.cuda.Stream(non_blocking=True)
    began, done, result = threading.Event(), threading.Event(), {}

    def capture():
        with victim:
            victim.begin_capture(mode=cupy.cuda.runtime.streamCaptureModeGlobal)
            began.set()
            done.wait()
            result.update(status_and_end(victim))

    def ask():
        prev = None
        if relax:
            _, prev = cu.cuThreadExchangeStreamCaptureMode(
                cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
            )
        if query == "cuStreamGetId":
            err = cu.cuStreamGetId(queried.ptr)[0]
        else:
            err = cu.cuStreamIsCapturing(queried.ptr)[0]
        if relax:
            cu.cuThreadExchangeStreamCaptureMode(prev)
        return err.name

    if where == "other_thread":
        t = threading.Thread(target=capture)
        t.start()
        began.wait()
        err = ask()
        done.set()
        t.join()
    else:  # this thread captures and queries
        victim.begin_capture(mode=cupy.cuda.runtime.streamCaptureModeGlobal)
        err = ask()
        result.update(status_and_end(victim))
    print(
        f"global capture in {where:<12} query={query:<19} relaxed_scope={relax!s:<5} "
        f"result={err:<40} capture_after={result['status']:<40} end_capture={result['end']}"
    )


for where in ("other_thread", "this_thread"):
    for query in ("cuStreamIsCapturing", "cuStreamGetId"):
        for relax in (False, True):
            other_stream_query(where, query, relax)
