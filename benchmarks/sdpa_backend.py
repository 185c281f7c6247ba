"""Which kernel torch's scaled_dot_product_attention runs on this GPU for an additive float mask, by the mask's
properties (GPU; one JSON line a case). Doge's dynamic mask attention learns its mask (exp(A softplus(dt(v))),
requires grad) as (batch, keys, heads) transposed and broadcast over the queries: a view whose last dim has stride
heads, which the tracer routes to SDPA's math path (autoparallel.tracer._fused_sdpa).

    python benchmarks/sdpa_backend.py > benchmarks/results/raw/sdpa_backend_h200.jsonl
"""

from __future__ import annotations

import json
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile


def case(name: str, mask_grad: bool, expanded: bool, transposed: bool = False, b: int = 4, h: int = 8, s: int = 2048,
         d: int = 128) -> dict:
    dev, dt = "cuda", torch.bfloat16
    q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    if transposed:  # Doge's: dt(v) is (batch, keys, heads), transposed to (batch, heads, keys): last-dim stride h
        base = torch.randn(b, s, h, device=dev, dtype=dt, requires_grad=mask_grad)
        mask = base.transpose(-1, -2)[:, :, None, :].expand(b, h, s, s)
    else:
        base = torch.randn(b, h, 1 if expanded else s, s, device=dev, dtype=dt, requires_grad=mask_grad)
        mask = base.expand(b, h, s, s) if expanded else base
    for _ in range(2):  # warm-up
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    kernels = sorted(((e.key, e.self_device_time_total) for e in prof.key_averages()), key=lambda x: -x[1])
    return {"case": name, "mask_requires_grad": mask_grad, "mask_expanded": expanded, "mask_strides": mask.stride(),
            "wall_ms": round(wall * 1e3, 2),
            "top_kernels": [(k[:90], round(t / 1e3, 2)) for k, t in kernels[:5]], "torch": torch.__version__}


def main() -> None:
    for name, grad, exp, tr in (("plain mask", False, False, False), ("learned mask", True, False, False),
                                ("broadcast mask", False, True, False), ("learned broadcast mask", True, True, False),
                                ("learned transposed broadcast mask (Doge)", True, True, True)):
        print(json.dumps(case(name, grad, exp, tr)), flush=True)


if __name__ == "__main__":
    main()
