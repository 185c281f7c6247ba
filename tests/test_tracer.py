"""Tracer: per-op costs against published formulas, graph structure, fallbacks, no weight copies."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autoparallel.errors import UserError
from autoparallel.graph import OpGraph
from autoparallel.specs import load_model_spec, parameter_count
from autoparallel.tracer import find_blocks, trace


def _fwd(g: OpGraph, op: str) -> list[dict]:
    return [a for _, a in g.nodes(phase="fwd") if a["op"] == op]


# ------------------------------------------------------------------ FLOPs
def test_linear_flops_are_2mnk_and_weight_grad_only_in_backward():
    M, K, N = 6, 32, 48
    lin = nn.Linear(K, N)
    g = trace(lin, example_inputs=torch.randn(M, K), dtype=torch.float32)
    (addmm,) = _fwd(g, "aten.addmm.default")
    assert addmm["flops"] == 2 * M * N * K
    assert addmm["module"] == ""            # the root module is the Linear itself
    assert addmm["param_count"] == K * N + N
    assert addmm["bytes_written"] == M * N * 4
    assert g.forward_flops == 2 * M * N * K
    # The input does not require grad: backward computes only the weight gradient (one mm).
    bwd_mm = [a for _, a in g.nodes(phase="bwd") if a["op"] == "aten.mm.default"]
    assert [a["flops"] for a in bwd_mm] == [2 * M * N * K]
    assert all(a["fwd_node"] is not None for a in bwd_mm)


def test_a_depthwise_convolution_is_its_own_class_with_a_backward_of_twice_its_forward():
    """A short convolution (one input channel a group, as LFM2's and Qwen3-Next's): the tracer marks its forward and
    backward depthwise (compute class conv_depthwise: PyTorch's depthwise kernels, bandwidth-bound), and counts
    the backward as the input's and the weight's gradients, each the forward's FLOPs (flop_counter's formula
    ignores the groups and counted the weight gradient at channels x that)."""
    from cost_models.compute import CLASS_CODE, classify_node
    channels, seq, k = 64, 128, 4

    class Scaled(nn.Module):  # a parameter before the convolution: its input needs a gradient too
        def __init__(self, groups: int) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(channels, 1))
            self.conv = nn.Conv1d(channels, channels, k, groups=groups, padding=k - 1, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x * self.scale)

    for module, depthwise in ((Scaled(channels), True), (Scaled(1), False)):
        g = trace(module, example_inputs=torch.randn(2, channels, seq), dtype=torch.float32)
        (fwd,) = _fwd(g, "aten.convolution.default")
        (bwd,) = [a for _, a in g.nodes(phase="bwd") if a["op"] == "aten.convolution_backward.default"]
        assert bool(fwd.get("depthwise")) == bool(bwd.get("depthwise")) == depthwise
        assert fwd["flops"] == 2 * 2 * channels * (seq + k - 1) * k * (1 if depthwise else channels)
        assert bwd["flops"] == 2 * fwd["flops"]  # grad_input and grad_weight, each the forward's
        want = CLASS_CODE["conv_depthwise"] if depthwise else CLASS_CODE["gemm"]
        assert classify_node(fwd) == classify_node(bwd) == want


@pytest.fixture(scope="module")
def gpt3_175b() -> OpGraph:
    return trace("gpt3-175b", batch=1, seq_len=2048)


def test_gpt3_175b_forward_flops_match_megatron_formula(gpt3_175b):
    spec = load_model_spec("gpt3-175b")
    B, s, L, h, V = 1, 2048, spec.num_layers, spec.hidden_size, spec.vocab_size
    formula = 24 * B * s * L * h * h * (1 + s / (6 * h)) + 2 * B * s * h * V
    assert gpt3_175b.forward_flops == pytest.approx(formula, rel=0.01)
    assert gpt3_175b.parameters == parameter_count(spec)
    assert len(gpt3_175b.blocks) == 96 and set(gpt3_175b.block_class.values()) == {0}


def test_gpt_backward_is_about_twice_forward(gpt3_175b):
    ratio = gpt3_175b.backward_flops / gpt3_175b.forward_flops
    assert 1.95 < ratio < 2.1


# ------------------------------------------------------------------ activation memory
def _gpt_small(attn_impl: str, layers: int = 2):
    h, a = 1024, 16
    spec = load_model_spec("gpt3-175b", num_layers=layers, hidden_size=h, num_heads=a, num_kv_heads=a,
                           head_dim=h // a, intermediate_size=4 * h, vocab_size=1000,
                           attn_impl=attn_impl, dropout=0.1, moe_layers=(False,) * layers)
    return spec, h, a


@pytest.mark.parametrize("attn_impl", ["eager", "sdpa"])
def test_gpt_block_activation_bytes_match_korthikanti(attn_impl):
    spec, h, a = _gpt_small(attn_impl)
    s, b = 512, 2
    g = trace(spec, batch=b, seq_len=s)  # bf16
    # Korthikanti et al.: s*b*h*(34 + 5*a*s/h) bytes per layer with 16-bit activations and dropout;
    # fused (flash) attention keeps no s x s tensors, which drops the 5as/h term.
    expected = s * b * h * (34 + (5 * a * s / h if attn_impl == "eager" else 0))
    per_block = g.activation_bytes_per_block
    assert set(per_block) == {"layers.0", "layers.1"}
    for v in per_block.values():
        assert v == pytest.approx(expected, rel=0.05)


def test_sdpa_saved_bytes_are_linear_in_seq_len():
    # flash attention saves O(s) statistics, so doubling s doubles a llama block's bytes (up to the
    # kernel's constant-size RNG state); the math path would add 4x the s x s scores
    a1 = trace("tiny-llama", seq_len=64).activation_bytes_per_block["layers.1"]
    a2 = trace("tiny-llama", seq_len=128).activation_bytes_per_block["layers.1"]
    assert abs(a2 - 2 * a1) <= 64


def test_saved_tensor_deduplicated_by_storage_and_attributed_to_producer():
    M, K, N = 4, 8, 16
    model = nn.Sequential(nn.Linear(K, N), nn.ReLU(), nn.Linear(N, K))
    g = trace(model, example_inputs=torch.randn(M, K), dtype=torch.float32)
    (relu,) = _fwd(g, "aten.relu.default")
    # relu's output is saved twice (by relu's own backward and as the second mm's input): counted once
    assert relu["saved_bytes"] == M * N * 4
    assert relu["module"] == "1"
    (first, second) = _fwd(g, "aten.addmm.default")
    relu_id = next(n for n, a in g.nodes(phase="fwd") if a["op"] == "aten.relu.default")
    first_id = next(n for n, a in g.nodes(phase="fwd") if a is first)
    assert g.g.has_edge(first_id, relu_id)
    assert nx_has_path(g, relu_id, next(n for n, a in g.nodes(phase="fwd") if a is second))


def nx_has_path(g: OpGraph, a: int, b: int) -> bool:
    import networkx as nx

    return nx.has_path(g.g, a, b)


# ------------------------------------------------------------------ structure
@pytest.fixture(scope="module")
def llama() -> OpGraph:
    return trace("tiny-llama", batch=2, seq_len=32)


def test_blocks_and_identical_classes(llama):
    assert llama.blocks == ["layers.0", "layers.1", "layers.2", "layers.3"]
    assert llama.block_class == dict.fromkeys(llama.blocks, 0)
    assert llama.parameters == parameter_count(load_model_spec("tiny-llama"))
    regions = {a["region"] for _, a in llama.nodes()}
    assert regions == {"pre", "block", "post"}
    pre_mods = {a["module"] for _, a in llama.nodes(phase="fwd", region="pre")}
    assert "tok_embeddings" in pre_mods
    post_mods = {a["module"] for _, a in llama.nodes(phase="fwd", region="post")}
    assert {"norm", "lm_head"} <= post_mods


def test_parametric_ops_and_edges(llama):
    ops = llama.parametric_ops
    q = ops["layers.1.attn.q_proj"]
    assert (q.kind, q.in_features, q.out_features, q.block) == ("linear", 64, 64, "layers.1")
    assert ops["layers.1.attn.k_proj"].shapes == {"weight": (32, 64)}
    assert ops["layers.1.attn_norm"].kind == "norm"
    assert ops["tok_embeddings"].kind == "embedding" and ops["tok_embeddings"].block is None
    edges = set(llama.param_op_edges)
    p = "layers.1."
    for x in ("q_proj", "k_proj", "v_proj"):
        assert (p + "attn_norm", p + "attn." + x) in edges
        assert (p + "attn." + x, p + "attn.o_proj") in edges
    for x in ("gate_proj", "up_proj"):
        assert (p + "mlp_norm", p + "mlp." + x) in edges
        assert (p + "mlp." + x, p + "mlp.down_proj") in edges
    assert (p + "attn.o_proj", p + "mlp_norm") in edges            # residual stream
    assert ("layers.0.mlp.down_proj", p + "attn_norm") in edges     # previous block's output
    assert ("tok_embeddings", "layers.0.attn_norm") in edges
    assert ("layers.3.mlp.down_proj", "norm") in edges and ("norm", "lm_head") in edges
    assert (p + "attn.q_proj", p + "mlp.down_proj") not in edges    # o_proj / norm lie between
    assert not any(a.startswith("layers.0.") and b.startswith("layers.2.") for a, b in edges)


def test_backward_ops_are_attributed_to_their_forward_module(llama):
    nodes = dict(llama.g.nodes(data=True))
    bwd = list(llama.nodes(phase="bwd"))
    assert bwd
    for _, a in bwd:
        if a["fwd_node"] is not None:
            assert nodes[a["fwd_node"]]["phase"] == "fwd"
            assert a["module"] == nodes[a["fwd_node"]]["module"]
    # every Linear gets its grad-input and grad-weight matmuls in backward
    for path, op in llama.parametric_ops.items():
        if op.kind == "linear":
            mms = [a for _, a in bwd if a["module"] == path and a["op"] == "aten.mm.default"]
            assert len(mms) == 2, path
    assert any(a["module"] == "tok_embeddings" and "embedding_dense_backward" in a["op"] for _, a in bwd)
    # a bwd op of block i is placed in block i
    for _, a in bwd:
        if a["module"].startswith("layers.2."):
            assert a["block"] == "layers.2"
    # forward saved tensors feed backward ops
    assert any(nodes[u]["phase"] == "fwd" and nodes[v]["phase"] == "bwd" for u, v in llama.g.edges)


def test_moe_expert_groups_and_mixed_block_classes():
    spec = load_model_spec("tiny-moe", moe_layers=(False, True, False, True))
    g = trace(spec, seq_len=16)
    assert g.block_class == {"layers.0": 0, "layers.1": 1, "layers.2": 0, "layers.3": 1}
    assert set(g.expert_groups) == {"layers.1.mlp.experts", "layers.3.mlp.experts"}
    eg = g.expert_groups["layers.1.mlp.experts"]
    assert (eg.num_experts, eg.top_k, eg.router, eg.block) == (4, 2, "layers.1.mlp.router.gate", "layers.1")
    assert eg.shared_experts == ("layers.1.mlp.shared_expert",)
    ex = g.parametric_ops["layers.1.mlp.experts"]
    assert ex.kind == "experts" and ex.num_experts == 4 and ex.shapes["w1"] == (4, 32, 64)
    assert ("layers.1.mlp_norm", "layers.1.mlp.experts") in g.param_op_edges
    # three grouped GEMMs, each reading one stacked weight, 2 * (T * k) * h * f FLOPs each
    expert_mm = [a for _, a in g.nodes(phase="fwd") if a["module"] == "layers.1.mlp.experts"
                 and a["op"] == "aten._grouped_mm.default"]
    assert len(expert_mm) == 3
    assert sum(a["param_count"] for a in expert_mm) == ex.param_count
    tokens = g.batch * g.seq_len * eg.top_k
    assert [a["flops"] for a in expert_mm] == [2.0 * tokens * 64 * 32] * 3
    # backward: per projection one grouped GEMM for the input gradient, one (2D x 2D) for the weights
    bwd = [a for _, a in g.nodes(phase="bwd") if a["op"] == "aten._grouped_mm.default"
           and a["module"] == "layers.1.mlp.experts"]
    assert len(bwd) == 6 and sum(a["flops"] for a in bwd) == 2 * sum(a["flops"] for a in expert_mm)
    assert g.parameters == parameter_count(spec)


def test_tied_embeddings_counted_once():
    g = trace("tiny-gpt", seq_len=16)
    spec = load_model_spec("tiny-gpt")
    assert spec.tie_word_embeddings
    assert g.parameters == parameter_count(spec)
    assert g.parametric_ops["lm_head"].tied == {"weight": "tok_embeddings"}
    assert g.parametric_ops["lm_head"].param_count == 0


def test_find_blocks_prefers_outer_list():
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.experts = nn.ModuleList(nn.Linear(4, 4) for _ in range(8))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(3))

    assert find_blocks(Net()) == ["blocks.0", "blocks.1", "blocks.2"]


# ------------------------------------------------------------------ fallbacks, inputs, safety
class _DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        if x.sum() > 0:  # needs a value: impossible on the meta device
            x = F.relu(x)
        return self.b(x)


def test_data_dependent_model_gives_module_level_graph_with_warning():
    with pytest.warns(UserWarning, match="module level"):
        g = trace(_DataDependent(), example_inputs=torch.randn(4, 16), dtype=torch.float32)
    assert g.module_level and g.warnings
    fwd = {a["module"]: a for _, a in g.nodes(phase="fwd")}
    assert {"a", "b"} <= set(fwd)
    assert fwd["a"]["op"] == "Linear" and fwd["a"]["flops"] == 2 * 4 * 16 * 16   # measured
    assert fwd["b"]["flops"] == 0 and fwd["b"]["param_count"] == 16 * 16 + 16   # never reached
    assert g.parameters == 2 * (16 * 16 + 16)
    assert g.backward_flops == 2 * g.forward_flops
    assert g.summary()["module_level"] is True


def test_item_call_falls_back_too():
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 8)

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return self.emb(t) * t.max().item()

    with pytest.warns(UserWarning):
        g = trace(M(), seq_len=4)
    # the embedding ran, then the root's own code (max) before .item() failed
    assert g.module_level and [a["module"] for _, a in g.nodes(phase="fwd")] == ["emb", ""]


def test_a_per_expert_loop_traces_as_under_uniform_routing():
    """DBRX planned from a module-level graph: its experts' nonzero and 0-d indices have no meta kernel.
    Traced op by op, each of the E experts gets rows x top_k / E tokens: the expert GEMMs' forward FLOPs are
    exactly those of the tokens' top-k experts (2 x rows x top_k x 2 x h x f), and the loop runs E times."""
    rows, h, f, experts, top_k = 32, 16, 24, 4, 2
    from loop_moe import ExpertLoop
    g = trace(ExpertLoop(h, f, experts, top_k), example_inputs=torch.randn(rows, h), dtype=torch.float32)
    assert not g.module_level
    assert any("uniform routing" in w for w in g.warnings)
    fwd = [a for _, a in g.nodes(phase="fwd")]
    gemm = sum(a["flops"] for a in fwd if a["op"] == "aten.mm.default" and a["module"] == "")
    assert gemm == 2 * rows * top_k * 2 * h * f
    assert sum(a["op"] == "aten.index_add.default" for a in fwd) == experts


def test_a_forward_that_raises_a_model_bug_is_a_user_error_not_a_fallback():
    """issue 15: a model whose forward raises ValueError was reported as data-dependent control flow and
    planned anyway; a bug of the model is the user's to fix (meta-device limits still fall back)."""
    class Broken(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 8)

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            raise ValueError("expected a batch of images")

    # where it raised: the model's own line, not the tracer's dispatch modes
    with pytest.raises(UserError, match=r"forward raised ValueError: expected a batch of images at "
                                        r"test_tracer\.py:\d+ \(forward\) \(on a batch of 1 x 4 tokens\)"):
        trace(Broken(), seq_len=4)


class _TokenLoop(nn.Module):
    """A block whose mixer loops over the tokens in Python (as Mamba's reference scan does): 3 forward ops a token
    in the loop (select, mul, add), plus the projection."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        state = torch.zeros_like(x[:, 0])
        outs = []
        for i in range(x.shape[1]):
            state = state * 0.5 + x[:, i]
            outs.append(state)
        return torch.stack(outs, dim=1)


class _TokenLoopNet(nn.Module):
    def __init__(self, width: int = 8, layers: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, width)
        self.layers = nn.ModuleList(_TokenLoop(width) for _ in range(layers))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        x = self.emb(t)
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_block_that_loops_over_its_tokens_is_refused_fast(monkeypatch):
    """Jamba's Mamba layers at 4096 tokens ran ~65,000 ops a layer on transformers' reference path and planning
    ran past 5 minutes; a block past the op limit is one error line naming the looping module. Under the limit the
    same model traces, every loop op in the graph."""
    import autoparallel.tracer as tracer

    monkeypatch.setattr(tracer, "MAX_BLOCK_FORWARD_OPS", 100)
    g = trace(_TokenLoopNet(), seq_len=16, dtype=torch.float32)   # 3 x 16 loop ops a block: under the limit
    assert sum(a["block"] == "layers.0" for _, a in g.nodes(phase="fwd")) > 3 * 16
    with pytest.raises(UserError, match=r"block layers\.0 ran more than 100 ops in one forward.*layers\.0 "
                                        r"\(_TokenLoop\).*shorter --seq-len"):
        trace(_TokenLoopNet(), seq_len=64, dtype=torch.float32)   # 3 x 64 loop ops


def test_bad_input_is_user_error():
    with pytest.raises(UserError, match="batch"):
        trace("tiny-llama", batch=0)
    with pytest.raises(UserError, match="example_inputs"):
        trace(nn.Sequential(nn.Linear(4, 4)))
    with pytest.raises(UserError):
        trace("no-such-model-xyz")


def test_user_model_is_not_modified_and_weights_not_copied(monkeypatch):
    model = nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 64))
    model.eval()
    ptrs = [p.data_ptr() for p in model.parameters()]

    def no_real_copy(self, memo):
        raise AssertionError(f"a real tensor of shape {tuple(self.shape)} was deep-copied")

    monkeypatch.setattr(torch.Tensor, "__deepcopy__", no_real_copy)
    monkeypatch.setattr(nn.Parameter, "__deepcopy__", no_real_copy)
    g = trace(model, batch=2, seq_len=8)
    monkeypatch.undo()
    assert g.parameters == 64 * 32 + 32 * 64 + 64
    assert [p.data_ptr() for p in model.parameters()] == ptrs
    assert all(p.device.type == "cpu" and p.grad is None for p in model.parameters())
    assert not model.training
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    # the default LM loss ran: cross entropy of the logits against the tokens
    assert any("nll_loss" in a["op"] for _, a in g.nodes(phase="fwd"))


def test_tracing_a_large_real_model_does_not_grow_memory_by_its_weights():
    # 4 x 4096 x 4096 fp32 = 256 MiB of touched weights; a copy would raise peak RSS by as much.
    code = textwrap.dedent("""
        import json, resource, torch
        from torch import nn
        from autoparallel.tracer import trace
        model = nn.Sequential(*[nn.utils.skip_init(nn.Linear, 4096, 4096, bias=False) for _ in range(4)])
        for p in model.parameters():
            p.data.fill_(0.5)
        trace(model, example_inputs=torch.randn(1, 4096), dtype=torch.float32)  # warm-up: imports
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        trace(model, example_inputs=torch.randn(8, 4096), dtype=torch.float32)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({"delta_kib": after - before}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    delta_mib = json.loads(out.stdout.strip().splitlines()[-1])["delta_kib"] / 1024
    assert delta_mib < 64


def test_summary_and_table(llama):
    s = llama.summary()
    for key in ("parameters", "forward_flops", "backward_flops", "num_blocks", "activation_bytes_per_block"):
        assert key in s
    assert s["num_blocks"] == 4 and s["parameters"] == llama.parameters
    assert s["activation_bytes_per_block"] == max(llama.activation_bytes_per_block.values()) > 0
    json.dumps(s)
    costs = llama.region_costs()
    assert list(costs) == ["pre", *llama.blocks, "post"]
    assert sum(c.fwd_flops for c in costs.values()) == pytest.approx(llama.forward_flops)
    table = llama.format_table()
    assert "parameters" in table and "4 x layers.*" in table and "aten.mm.default" in table


def test_gqa_attention_flops_survive_a_formula_that_wants_equal_heads(monkeypatch):
    """torch 2.11's flop_counter formula for fused attention asserts equal query and key/value head counts;
    the tracer hands it key/value repeated to the query's heads (the FLOPs of the GQA kernel), so a plan
    made under that torch prices attention as under 2.13. Simulated here by wrapping the registry's
    formulas with 2.11's check: the attention FLOPs must not change (they were 0 before the fix)."""
    from torch.utils.flop_counter import flop_registry

    from autoparallel.tracer import _SDPA_QUERY_ARG
    spec = load_model_spec({"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128,
                            "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
                            "max_position_embeddings": 64})

    def attention_flops() -> float:
        g = trace(spec, batch=1, seq_len=64)
        return sum(a["flops"] for _, a in g.g.nodes(data=True) if "scaled_dot_product" in a["op"])

    reference = attention_flops()
    assert reference > 0
    for packet, q in _SDPA_QUERY_ARG.items():
        original = flop_registry[packet]

        def strict(*args, _original=original, _q=q, **kwargs):
            if args[_q].shape[1] != args[_q + 1].shape[1]:
                raise AssertionError("heads differ")  # what torch 2.11's sdpa_flop_count does
            return _original(*args, **kwargs)
        monkeypatch.setitem(flop_registry, packet, strict)
    assert attention_flops() == reference


class _FusedGateUp(torch.nn.Module):
    """SwiGLU over the halves of one fused projection (Phi-3's gate_up_proj), heads made contiguous after a
    transpose, and a dense product."""

    def __init__(self, h: int = 16) -> None:
        super().__init__()
        self.gate_up = torch.nn.Linear(h, 2 * h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        y = torch.nn.functional.silu(gate) * up                 # gapped inputs: strided
        heads = y.view(x.shape[0], 4, -1).transpose(0, 1).contiguous()  # a transposed copy: strided
        return (heads * heads).sum()                            # dense: not strided


def test_elementwise_ops_that_read_through_gaps_are_marked_strided():
    """The tracer's `strided` flag (TensorIterator's non-vectorized path) and the cost model's class for it:
    silu and the product read halves of one [M, 2h] output, the copy reads a transposed view; the dense
    square and the matmul are not marked."""
    from cost_models.compute import CLASS_CODE, classify_node
    g = trace(_FusedGateUp(), example_inputs=torch.randn(8, 16), dtype=torch.float32, compiled_saved=False)
    fwd = {a["op"].split(".")[1]: a for _, a in g.g.nodes(data=True) if a["phase"] == "fwd"}
    marked = {a["op"].split(".")[1] for _, a in g.g.nodes(data=True) if a["phase"] == "fwd" and a["strided"]}
    assert {"silu", "clone"} <= marked
    assert "mm" not in marked and "sum" not in marked
    products = [a for _, a in g.g.nodes(data=True) if a["phase"] == "fwd" and a["op"].split(".")[1] == "mul"]
    assert [a["strided"] for a in products] == [True, False]  # silu(gate) * up, then heads * heads
    assert classify_node(fwd["silu"]) == CLASS_CODE["strided"]
    assert classify_node(products[1]) == CLASS_CODE["other"]


class _Norms(torch.nn.Module):
    """A Hugging Face RMSNorm's fp32 products (x * rsqrt over the last dimension, weight * x over the rows),
    the same in bf16, and an fp32 table broadcast over batch and heads at once (the catalog's RoPE)."""

    def __init__(self, h: int = 16) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(h, h, bias=False)
        self.weight = torch.nn.Parameter(torch.ones(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x).float()                                       # [B, S, h] fp32
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)    # column: fp32 broadcast
        y = self.weight.float() * y                                    # [h] over rows: fp32 broadcast
        z = y.to(torch.bfloat16) * self.weight.to(torch.bfloat16)      # bf16: the plain class
        table = torch.ones(x.shape[1], 1, 4, dtype=torch.float32)       # [S, 1, D] over [B, S, H, D]
        r = y.view(*y.shape[:2], 4, 4) * table                         # both sides of S: not an edge
        return z.float().sum() + r.sum()


def test_fp32_broadcasts_along_one_edge_get_their_own_class():
    """The tracer's `fp32_broadcast` (a broadcast in fp32 throughout, repeated along leading or trailing
    dimensions only) and the cost model's class for it, beside bf16 broadcasts and a table repeated on both
    sides of the dimensions it spans, which keep broadcast_binary."""
    from cost_models.compute import CLASS_CODE, CLASSES, classify_node
    g = trace(_Norms(), example_inputs=torch.randn(2, 8, 16), dtype=torch.float32, compiled_saved=False)
    products = [CLASSES[classify_node(a)] for _, a in g.g.nodes(data=True)
                if a["phase"] == "fwd" and a["op"].split(".")[1] == "mul" and a["broadcast"]]
    assert products == ["broadcast_binary_fp32", "broadcast_binary_fp32", "broadcast_binary", "broadcast_binary"]
    assert CLASS_CODE["broadcast_binary_fp32"] != CLASS_CODE["broadcast_binary"]


class _Mixer(torch.nn.Module):
    """A state-space-like mixer: a depthwise Conv1d (weight [C, 1, K]) and per-head block-diagonal gates
    [heads, w, w] (RecurrentGemma's RG-LRU): 3-D weights that are not experts."""

    def __init__(self, h: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.conv1d = torch.nn.Conv1d(h, h, 4, groups=h, padding=3)
        self.gate_weight = torch.nn.Parameter(torch.randn(heads, h // heads, h // heads))
        self.out = torch.nn.Linear(h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1d(x.transpose(1, 2))[..., : x.shape[1]].transpose(1, 2)
        b, s, h = y.shape
        y = torch.einsum("bshw,hwv->bshv", y.reshape(b, s, self.gate_weight.shape[0], -1), self.gate_weight)
        return self.out(y.reshape(b, s, h))


class _MixerModel(torch.nn.Module):
    """Tokens -> embedding -> two mixers -> logits, as a user's language model."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 16)
        self.layers = torch.nn.ModuleList(_Mixer() for _ in range(2))
        self.head = torch.nn.Linear(16, 64)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


def test_convolutions_and_per_head_weights_are_not_experts():
    """3-D weights outside a module named for experts (a Conv1d's, per-head gates) are no expert group:
    taken for one, the planner offered expert parallelism over 1536 "experts" of Falcon-H1's conv1d."""
    from autoparallel.api import plan_model
    g = trace(_MixerModel(), batch=2, seq_len=8, compiled_saved=False)
    assert g.expert_groups == {}
    assert g.parametric_ops["layers.0.conv1d"].kind == g.parametric_ops["layers.0"].kind == "other"
    with pytest.raises(UserError, match="no experts"):
        plan_model(_MixerModel(), hardware="h100-sxm", gpus=2, global_batch=2, seq_len=8, fix={"ep": 2})


class _LatentAttention(torch.nn.Module):
    """Attention whose values are narrower than its queries and keys (DeepSeek's MLA: 192 against 128)."""

    def __init__(self, h: int = 32, heads: int = 4, dqk: int = 12, dv: int = 8) -> None:
        super().__init__()
        self.heads, self.dqk, self.dv = heads, dqk, dv
        self.qk = torch.nn.Linear(h, 2 * heads * dqk, bias=False)
        self.v = torch.nn.Linear(h, heads * dv, bias=False)
        self.o = torch.nn.Linear(heads * dv, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k = self.qk(x).view(b, s, 2, self.heads, self.dqk).permute(2, 0, 3, 1, 4)
        v = self.v(x).view(b, s, self.heads, self.dv).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


def test_attention_with_narrower_values_traces_op_level_as_memory_efficient_attention():
    """Flash attention needs one head dim for q, k and v; a GPU runs such attention memory-efficient, and the
    trace must too: routed to flash, the meta output took q's width and the whole model fell to module level."""
    g = trace(_LatentAttention(), example_inputs=torch.randn(2, 8, 32), loss_fn=lambda y, *_: y.float().pow(2).mean(),
              compiled_saved=False)
    assert not g.module_level
    attn = [a for _, a in g.g.nodes(data=True) if "scaled_dot_product" in a["op"] and a["phase"] == "fwd"]
    assert [(a["op"], a["out_shapes"][0]) for a in attn] == [
        ("aten._scaled_dot_product_efficient_attention.default", (2, 4, 8, 8))]


class _LearnedMaskAttention(torch.nn.Module):
    """Attention under an additive mask learned from the values and broadcast over the queries, as Doge's dynamic
    mask attention builds it: exp(A softplus(dt(v))) transposed to (batch, heads, keys), a view whose last dim
    is not contiguous unless `contiguous`."""

    def __init__(self, h: int = 32, heads: int = 4, contiguous: bool = False) -> None:
        super().__init__()
        self.heads, self.contiguous = heads, contiguous
        self.qkv = torch.nn.Linear(h, 3 * h, bias=False)
        self.dt = torch.nn.Linear(h, heads, bias=False)
        self.o = torch.nn.Linear(h, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        dt = torch.exp(F.softplus(self.dt(v.transpose(1, 2).reshape(b, s, h)))).transpose(-1, -2)
        mask = dt[:, :, None, :].expand(-1, -1, s, -1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.contiguous() if self.contiguous else mask)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


@pytest.mark.parametrize("contiguous", [False, True])
def test_a_mask_with_a_strided_last_dim_traces_sdpas_math_path_in_fp32(contiguous):
    """The fused kernels want the mask's last dim at stride 1: on an H200 (torch 2.11) SDPA ran a bf16 learned mask
    of strides (16384, 1, 0, 8) on its math path, fp32 GEMMs, and the same mask made contiguous memory-efficient
    (benchmarks/sdpa_backend.py). The trace runs what the GPU runs: the math path's fp32 batched products, which
    the cost model prices as fp32 GEMMs (compute.CLASSES gemm_fp32), or the fused kernel."""
    g = trace(_LearnedMaskAttention(contiguous=contiguous).to(torch.bfloat16),
              example_inputs=torch.randn(2, 8, 32, dtype=torch.bfloat16),
              loss_fn=lambda y, *_: y.float().pow(2).mean(), compiled_saved=False)
    fwd = [a for _, a in g.g.nodes(data=True) if a["phase"] == "fwd"]
    fused = [a["op"] for a in fwd if "scaled_dot_product" in a["op"]]
    fp32_products = [a for a in fwd if a["op"] == "aten.bmm.default" and a["out_dtypes"] == ["float32"]]
    if contiguous:
        assert fused == ["aten._scaled_dot_product_efficient_attention.default"] and not fp32_products
    else:
        assert not fused and len(fp32_products) == 2  # q k^T and p v, upcast
