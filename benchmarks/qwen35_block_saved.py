"""What one Qwen3.5 decoder layer of each type keeps for its backward on a GPU, eager and torch.compile'd (the
layer's own `.compile()`, Inductor), at 4096 tokens a row: saved bytes (autograd's saved-tensor hooks, by storage,
without parameters and rotary tables), what the forward holds, the forward and backward peaks, per row in GiB, and
Dynamo's counters (graph breaks). Run on a lent H200 (torch 2.11, transformers 5.17) in the thirty-fifth session:

    B=2 python benchmarks/qwen35_block_saved.py      # -> benchmarks/results/raw/qwen35_block_saved_s111.log

(it found the compiled gated-DeltaNet layer keeping 3.853 GiB a row against eager's 2.067: torch 2.11's Dynamo
answers torch.compiler.is_exporting() True under torch.compile, and transformers' fallback then takes its row-update
branch; autoparallel/compiled_saved.py `_dynamo_flags`). Reformatted here from the compact script sent to the device (same steps).
"""
import os

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from transformers import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5TextRotaryEmbedding

B, S, GIB = int(os.environ.get("B", 2)), 4096, 2**30
CONFIG = Qwen3_5TextConfig(hidden_size=4096, intermediate_size=12288, num_hidden_layers=8, num_attention_heads=16,
                           num_key_value_heads=4, head_dim=256, vocab_size=1000)
CONFIG._attn_implementation = "sdpa"


def measure(index: int, mode: str, rope: tuple) -> None:
    layer = Qwen3_5DecoderLayer(CONFIG, index).to("cuda", torch.bfloat16).train()
    if mode == "ind":
        layer.compile()
    skip = {StorageWeakRef(t.untyped_storage()) for t in [*layer.parameters(), *rope]}
    seen: dict = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = StorageWeakRef(t.untyped_storage())
        if key not in skip:
            seen.setdefault(key, t.untyped_storage().nbytes())
        return t

    for _ in range(2):  # the second pass, compiled
        seen.clear()
        x = torch.randn(B, S, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = layer(x, position_embeddings=rope, attention_mask=None)
        torch.cuda.synchronize()
        held, fwd_peak = torch.cuda.memory_allocated() - base, torch.cuda.max_memory_allocated() - base
        g = torch.randn_like(y)
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        y.backward(g)
        torch.cuda.synchronize()
        bwd_peak = torch.cuda.max_memory_allocated() - start
        saved = sum(seen.values())
        del y, g, x
    per_row = [v / B / GIB for v in (saved, held, fwd_peak, bwd_peak)]
    print(CONFIG.layer_types[index], mode, "saved/row {:.3f} held(y incl)/row {:.3f} fwdpeak/row {:.3f} "
          "bwdpeak-above-start/row {:.3f}".format(*per_row), flush=True)
    del layer
    torch.cuda.empty_cache()


def main() -> None:
    rope = Qwen3_5TextRotaryEmbedding(CONFIG).to("cuda")(torch.zeros(1, device="cuda", dtype=torch.bfloat16),
                                                          torch.arange(S, device="cuda")[None].expand(3, B, S))
    for index in (0, 3):  # a linear_attention layer and a full_attention one
        for mode in ("eag", "ind"):
            measure(index, mode, rope)
    from torch._dynamo.utils import counters
    print({k: dict(v) for k, v in counters.items() if k in ("graph_break", "stats", "recompiles")})


if __name__ == "__main__":
    main()
