"""Which kernel torch's scaled_dot_product_attention runs on this GPU for an additive float mask, by the mask's
properties (GPU; one JSON line a case). A learned mask (Doge's dynamic mask attention: exp(A softplus(dt(v)))
broadcast over the queries) requires grad and is a stride-0 view; the cost model prices SDPA as a fused kernel.

    python benchmarks/sdpa_backend.py > sdpa_backend.jsonl
"""

from __future__ import annotations

import json
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile


def case(name: str, mask_grad: bool, expanded: bool, b: int = 4, h: int = 8, s: int = 2048, d: int = 128) -> dict:
    dev, dt = "cuda", torch.bfloat16
    q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
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
    return {"case": name, "mask_requires_grad": mask_grad, "mask_expanded": expanded, "wall_ms": round(wall * 1e3, 2),
            "top_kernels": [(k[:90], round(t / 1e3, 2)) for k, t in kernels[:5]], "torch": torch.__version__}


def main() -> None:
    for name, grad, exp in (("plain mask", False, False), ("learned mask", True, False),
                            ("broadcast mask", False, True), ("learned broadcast mask (Doge)", True, True)):
        print(json.dumps(case(name, grad, exp)), flush=True)


if __name__ == "__main__":
    main()
