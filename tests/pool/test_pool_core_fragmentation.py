# SPDX-License-Identifier: Apache-2.0
"""Fragmentation of the stream-ordered pool's core under a transformer training step (no GPU).

The trace is synthetic (test-only): the allocations PyTorch makes for one GPT-2-small step
(12 layers, 768 wide, sequence 1024, batch 8, bf16 autocast over fp32 weights, AdamW,
``zero_grad(set_to_none=True)``), modelled tensor by tensor: per layer, activations kept for
backward and temporaries freed at once; the logits and the fp32 loss tensors (hundreds of MB
each) allocated and freed in forward and again in backward; gradients each step; the
optimizer's state allocated once. It runs on one stream through the core on host chunks
(the upstream's chunks are never touched, so they cost address space, not host memory).

The footprint is what the pool holds from the upstream after the steps; peak live is the most
bytes (rounded to the granule) allocated at once. PyTorch's caching allocator holds about
1.0x-1.1x its peak live on such a step; the bound here is 1.25x (a pool within it holds at
most about 1.14x what such an allocator holds).
"""

import pytest

from rmm_fences_testing import HostStreamOrderedPool

GRANULE = 256
MIB = 1 << 20


def rounded(n):
    return max(GRANULE, (n + GRANULE - 1) // GRANULE * GRANULE)


class TraceBuilder:
    """Allocation events: ("alloc", name, bytes) and ("free", name)."""

    def __init__(self):
        self.events = []
        self.live = set()
        self.serial = 0

    def alloc(self, nbytes, name=None):
        if name is None:
            self.serial += 1
            name = f"t{self.serial}"
        assert name not in self.live, name
        self.live.add(name)
        self.events.append(("alloc", name, nbytes))
        return name

    def free(self, *names):
        for name in names:
            self.live.remove(name)
            self.events.append(("free", name))


def transformer_step_trace(steps=4, layers=12, width=768, seq=1024, batch=8, vocab=50257, heads=12):
    """The allocations of ``steps`` training steps of a GPT-2-shaped model (see the module
    docstring); sizes in bytes, fp32 = 4, bf16 = 2."""
    t = TraceBuilder()
    c, n, v = width, batch * seq, vocab
    f32, bf16 = 4, 2
    # Parameters (fp32), made once before training.
    params = {"wte": v * c, "wpe": seq * c, "lnf_w": c, "lnf_b": c}
    for i in range(layers):
        params.update(
            {
                f"l{i}_ln1_w": c,
                f"l{i}_ln1_b": c,
                f"l{i}_attn_w": c * 3 * c,
                f"l{i}_attn_b": 3 * c,
                f"l{i}_proj_w": c * c,
                f"l{i}_proj_b": c,
                f"l{i}_ln2_w": c,
                f"l{i}_ln2_b": c,
                f"l{i}_fc_w": c * 4 * c,
                f"l{i}_fc_b": 4 * c,
                f"l{i}_mlp_w": 4 * c * c,
                f"l{i}_mlp_b": c,
            }
        )
    for name, count in params.items():
        t.alloc(count * f32, "p_" + name)

    def layer_norm():
        """fp32 layer norm, then the autocast cast to bf16 for the next matmul: returns the
        tensors saved for backward besides its input (mean, rstd, bf16 output)."""
        out = t.alloc(n * c * f32)
        mean, rstd = t.alloc(n * f32), t.alloc(n * f32)
        h = t.alloc(n * c * bf16)
        t.free(out)
        return [mean, rstd, h]

    def linear(w, b, out_features):
        """autocast addmm: casts of the weight and bias (saved), the bf16 output."""
        wc = t.alloc(params[w] * bf16)
        bc = t.alloc(params[b] * bf16)
        out = t.alloc(n * out_features * bf16)
        return [wc, bc], out

    for step in range(steps):
        idx, tgt = t.alloc(n * 8), t.alloc(n * 8)
        # ---- forward -----------------------------------------------------------------
        tok, pos = t.alloc(n * c * f32), t.alloc(seq * c * f32)
        x = t.alloc(n * c * f32)
        t.free(tok, pos)
        saved = []  # per layer, what backward frees
        for i in range(layers):
            keep = [x]
            keep += layer_norm()
            ws, qkv = linear(f"l{i}_attn_w", f"l{i}_attn_b", 3 * c)
            keep += ws + [qkv]
            att = t.alloc(n * c * bf16)  # flash attention output
            lse = t.alloc(batch * heads * seq * f32)
            keep += [att, lse]
            ws, proj = linear(f"l{i}_proj_w", f"l{i}_proj_b", c)
            keep += ws
            x2 = t.alloc(n * c * f32)  # residual add (fp32 + bf16)
            t.free(proj)
            keep.append(x2)
            keep += layer_norm()
            ws, fc = linear(f"l{i}_fc_w", f"l{i}_fc_b", 4 * c)
            keep += ws + [fc]
            gelu = t.alloc(n * 4 * c * bf16)
            keep.append(gelu)
            ws, mlp = linear(f"l{i}_mlp_w", f"l{i}_mlp_b", c)
            keep += ws
            x = t.alloc(n * c * f32)
            t.free(mlp)
            saved.append(keep)
        head = [x, *layer_norm()]
        wte_bf16 = t.alloc(v * c * bf16)
        logits = t.alloc(n * v * bf16)  # ~823 MB at GPT-2 small, batch 8
        logits_f32 = t.alloc(n * v * f32)  # cross entropy runs in fp32 under autocast
        logp = t.alloc(n * v * f32)  # log_softmax, saved for backward
        t.free(logits_f32)
        loss = t.alloc(f32)
        # ---- backward ----------------------------------------------------------------
        grad_nll = t.alloc(n * v * f32)
        grad_logits_f32 = t.alloc(n * v * f32)
        t.free(grad_nll, logp)
        grad_logits = t.alloc(n * v * bf16)
        t.free(grad_logits_f32)
        grad_h = t.alloc(n * c * bf16)
        grad_wte_bf16 = t.alloc(v * c * bf16)
        grads = {}
        grads["wte"] = t.alloc(v * c * f32)
        t.free(grad_wte_bf16, grad_logits, wte_bf16)
        grad_f32 = t.alloc(n * c * f32)
        t.free(grad_h)
        grad_x = t.alloc(n * c * f32)
        grads["lnf_w"], grads["lnf_b"] = t.alloc(c * f32), t.alloc(c * f32)
        t.free(grad_f32, *head)

        def linear_backward(grads, w, b, in_features):
            g_in = t.alloc(n * in_features * bf16)
            g_w = t.alloc(params[w] * bf16)
            grads[w] = t.alloc(params[w] * f32)
            t.free(g_w)
            grads[b] = t.alloc(params[b] * f32)
            return g_in

        def layer_norm_backward(grads, grad_bf16, grad_res, w, b):
            g32 = t.alloc(n * c * f32)
            g_ln = t.alloc(n * c * f32)
            grads[w], grads[b] = t.alloc(c * f32), t.alloc(c * f32)
            t.free(g32, grad_bf16)
            new_res = t.alloc(n * c * f32)  # residual gradient sum
            t.free(g_ln, grad_res)
            return new_res

        for i in reversed(range(layers)):
            keep = saved[i]
            # keep: x, mean, rstd, h1, w, b, qkv, att, lse, w, b, x2, mean, rstd, h2, w, b,
            #       fc, gelu, w, b
            g = t.alloc(n * c * bf16)  # grad of the MLP output, cast to bf16
            g_gelu = linear_backward(grads, f"l{i}_mlp_w", f"l{i}_mlp_b", 4 * c)
            t.free(g, keep[18], keep[19], keep[20])
            g_fc = t.alloc(n * 4 * c * bf16)
            t.free(g_gelu, keep[17])
            g_h2 = linear_backward(grads, f"l{i}_fc_w", f"l{i}_fc_b", c)
            t.free(g_fc, keep[15], keep[16])
            grad_x = layer_norm_backward(grads, g_h2, grad_x, f"l{i}_ln2_w", f"l{i}_ln2_b")
            t.free(keep[11], keep[12], keep[13], keep[14])
            g = t.alloc(n * c * bf16)
            g_att = linear_backward(grads, f"l{i}_proj_w", f"l{i}_proj_b", c)
            t.free(g, keep[9], keep[10])
            dq, dk, dv = (t.alloc(n * c * bf16) for _ in range(3))
            t.free(g_att, keep[7], keep[8])
            g_qkv = t.alloc(n * 3 * c * bf16)
            t.free(dq, dk, dv, keep[6])
            g_h1 = linear_backward(grads, f"l{i}_attn_w", f"l{i}_attn_b", c)
            t.free(g_qkv, keep[4], keep[5])
            grad_x = layer_norm_backward(grads, g_h1, grad_x, f"l{i}_ln1_w", f"l{i}_ln1_b")
            t.free(keep[0], keep[1], keep[2], keep[3])
        g_emb = t.alloc(v * c * f32)
        t.free(g_emb)
        grads["wpe"] = t.alloc(seq * c * f32)
        t.free(grad_x)
        # ---- optimizer (AdamW, foreach) ----------------------------------------------
        if step == 0:
            for name, count in params.items():
                t.alloc(count * f32, "m_" + name)
                t.alloc(count * f32, "v_" + name)
        temps = [t.alloc(count * f32) for count in params.values()]
        temps2 = [t.alloc(count * f32) for count in params.values()]
        t.free(*temps)
        t.free(*temps2)
        # ---- zero_grad(set_to_none=True), end of the step ------------------------------
        t.free(*(grads[name] for name in params))
        t.free(logits, loss, idx, tgt)
    return t.events


def replay(pool, events, stream=0):
    """Runs ``events`` through ``pool`` on one stream; returns (peak live bytes, pool bytes
    after the last step)."""
    ptrs = {}
    live = peak = 0
    for event in events:
        if event[0] == "alloc":
            _, name, nbytes = event
            ptrs[name] = (pool.allocate(nbytes, stream), nbytes)
            live += rounded(nbytes)
            peak = max(peak, live)
        else:
            ptr, nbytes = ptrs.pop(event[1])
            pool.deallocate(ptr, nbytes, stream)
            live -= rounded(nbytes)
    return peak, pool.pool_size()


def test_trace_is_balanced():
    """Every tensor of a step is freed by its end except parameters and optimizer state."""
    events = transformer_step_trace(steps=2, layers=2, width=64, seq=32, batch=2, vocab=500)
    allocs = {e[1] for e in events if e[0] == "alloc"}
    frees = {e[1] for e in events if e[0] == "free"}
    assert {a[:2] for a in allocs - frees} == {"p_", "m_", "v_"}


@pytest.mark.parametrize(
    "steps, batch",
    [
        (2, 8),
        (8, 8),
        (8, 1),
        (8, 2),
        (8, 4),
        (8, 16),
        (8, 24),
    ],
)
def test_transformer_step_footprint(steps, batch):
    """The pool holds at most 1.25x the peak live bytes of GPT-2-small training steps."""
    events = transformer_step_trace(steps=steps, batch=batch)
    pool = HostStreamOrderedPool()
    peak, held = replay(pool, events)
    assert pool.violations == []
    ratio = held / peak
    assert ratio <= 1.25, (
        f"footprint {held / 1e9:.2f} GB over peak live {peak / 1e9:.2f} GB = {ratio:.2f}x "
        f"after {steps} steps at batch {batch} (bound 1.25x)"
    )
