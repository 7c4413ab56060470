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
