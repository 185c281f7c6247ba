"""Model definitions: layout, forward/backward, meta build, pipeline deletion, TP-style head slicing,
MoE routing against a naive reference, init determinism, load_model with user callables."""

from __future__ import annotations

import copy
import math
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autoparallel.errors import UserError
from autoparallel.models import GroupedExperts, MoE, build_model
from autoparallel.models.moe import _autocast_dtype
from autoparallel.specs import load_model, load_model_spec, parameter_count

TINY = ["tiny-gpt", "tiny-llama", "tiny-moe"]


def make(name: str, seed: int = 0, **overrides) -> nn.Module:
    torch.manual_seed(seed)
    model = build_model(load_model_spec(name, **overrides))
    model.init_weights()
    return model


def lm_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


@pytest.mark.parametrize("name", TINY)
def test_forward_backward_finite(name):
    model = make(name)
    spec = model.spec
    tokens = torch.randint(0, spec.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    logits = model(tokens)
    assert logits.shape == (2, 24, spec.vocab_size) and logits.dtype == torch.float32
    loss = lm_loss(logits, tokens)
    # Fresh init (std 0.02) predicts near-uniform: loss close to ln V.
    assert torch.isfinite(loss) and abs(loss.item() - math.log(spec.vocab_size)) < 0.5
    loss.backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n
    assert any(p.grad.abs().sum() > 0 for p in model.parameters())


def test_module_layout():
    gpt, llama, moe = (make(n) for n in TINY)
    assert isinstance(gpt.layers, nn.ModuleDict) and list(gpt.layers) == ["0", "1", "2", "3"]
    assert gpt.pos_embeddings is not None and llama.pos_embeddings is None
    assert isinstance(gpt.norm, nn.LayerNorm) and isinstance(llama.norm, nn.RMSNorm)
    assert gpt.lm_head.weight is gpt.tok_embeddings.weight  # gpt ties, llama does not
    assert llama.lm_head.weight is not llama.tok_embeddings.weight
    names = {n for n, _ in moe.named_parameters()}
    for suffix in ("attn_norm.weight", "attn.q_proj.weight", "attn.q_proj.bias", "attn.k_proj.weight",
                   "attn.v_proj.weight", "attn.o_proj.weight", "mlp_norm.weight", "mlp.router.gate.weight",
                   "mlp.experts.w1", "mlp.experts.w2", "mlp.experts.w3", "mlp.shared_expert.gate_proj.weight",
                   "mlp.shared_expert.up_proj.weight", "mlp.shared_expert.down_proj.weight",
                   "mlp.shared_expert_gate.weight"):
        assert f"layers.0.{suffix}" in names, suffix
    e = moe.layers["0"].mlp.experts
    h, f, E = moe.spec.hidden_size, moe.spec.moe_intermediate_size, moe.spec.num_experts
    assert e.w1.shape == (E, f, h) and e.w2.shape == (E, h, f) and e.w3.shape == (E, f, h)
    assert {"up_proj", "down_proj"} == {n for n, _ in gpt.layers["0"].mlp.named_children()}
    assert {"gate_proj", "up_proj", "down_proj"} == {n for n, _ in llama.layers["0"].mlp.named_children()}
    qwen3 = build_model(load_model_spec({"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32,
                                         "intermediate_size": 64, "num_hidden_layers": 1,
                                         "num_attention_heads": 4, "num_key_value_heads": 2,
                                         "head_dim": 16}))
    assert qwen3.layers["0"].attn.q_norm.weight.shape == (16,)
    assert qwen3.layers["0"].attn.q_proj.weight.shape == (64, 32)


def test_meta_build_allocates_nothing():
    spec = load_model_spec("llama3-405b")
    with torch.device("meta"):
        model = build_model(spec)
        out = model(torch.zeros(1, 16, dtype=torch.long))
    tensors = list(model.parameters()) + list(model.buffers())
    assert tensors and all(t.is_meta for t in tensors)
    assert out.is_meta and out.shape == (1, 16, spec.vocab_size)
    assert sum(p.numel() for p in model.parameters()) == parameter_count(spec)
    # MoE on meta: routing counts unknown, only shapes. aten._grouped_mm's meta kernel takes bf16 only
    # (the CUDA kernel's rule); autoparallel's tracer accepts any dtype (test_tracer).
    with torch.device("meta"):
        moe = build_model(load_model_spec("qwen3-30b-a3b", num_layers=2)).to(torch.bfloat16)
        out = moe(torch.zeros(2, 8, dtype=torch.long))
    assert out.is_meta and out.shape == (2, 8, moe.spec.vocab_size)


def test_to_empty_then_init_weights_reties_and_is_deterministic():
    spec = load_model_spec("tiny-gpt")
    with torch.device("meta"):
        model = build_model(spec)
    model.to_empty(device="cpu")
    torch.manual_seed(3)
    model.init_weights()
    assert model.lm_head.weight is model.tok_embeddings.weight
    ref = build_model(spec)  # built on cpu (its construction consumes RNG draws of its own)
    torch.manual_seed(3)
    ref.init_weights()  # init depends only on the RNG state at the call
    for (n, a), (_, b) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert torch.equal(a, b), n
    ln = model.layers["0"].attn_norm
    assert torch.equal(ln.weight, torch.ones_like(ln.weight)) and torch.equal(ln.bias, torch.zeros_like(ln.bias))
    # residual-output projections are scaled down by sqrt(2 L)
    o_std = model.layers["0"].attn.o_proj.weight.std().item()
    q_std = model.layers["0"].attn.q_proj.weight.std().item()
    assert o_std < q_std / 2


def split_stages(model: nn.Module, cut: int) -> tuple[nn.Module, nn.Module]:
    """torchtitan-style: each stage is a deep copy with the other stage's pieces deleted."""
    first, second = copy.deepcopy(model), copy.deepcopy(model)
    n = len(model.layers)
    for i in range(cut, n):
        del first.layers[str(i)]
    for i in range(cut):
        del second.layers[str(i)]
    first.norm = None
    first.lm_head = None
    second.tok_embeddings = None
    second.pos_embeddings = None
    return first, second


@pytest.mark.parametrize("name", TINY)
def test_pipeline_style_deletion(name):
    model = make(name).eval()
    tokens = torch.randint(0, model.spec.vocab_size, (2, 12), generator=torch.Generator().manual_seed(2))
    full = model(tokens)
    first, second = split_stages(model, 1)
    hidden = first(tokens)
    assert hidden.shape == (2, 12, model.spec.hidden_size)
    assert list(second.layers) == ["1", "2", "3"]  # FQNs kept
    torch.testing.assert_close(second(hidden), full, rtol=0, atol=0)


def test_seeded_init_matches_across_pipeline_stages():
    full = build_model(load_model_spec("tiny-moe"))
    full.init_weights(seed=7)
    _, second = split_stages(build_model(load_model_spec("tiny-moe")), 2)
    second.init_weights(seed=7)
    full_params = dict(full.named_parameters())
    for n, p in second.named_parameters():
        assert torch.equal(p, full_params[n]), n
    other = build_model(load_model_spec("tiny-moe"))
    other.init_weights(seed=8)
    assert not torch.equal(other.layers["0"].attn.q_proj.weight, full.layers["0"].attn.q_proj.weight)


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-llama"])
def test_eager_attention_matches_sdpa(name):
    sdpa = make(name).eval()
    eager = make(name, attn_impl="eager").eval()
    tokens = torch.randint(0, sdpa.spec.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(eager(tokens), sdpa(tokens), rtol=1e-5, atol=1e-5)


def test_gpt_dropout_in_training_only():
    model = make("tiny-gpt", attn_impl="eager", dropout=0.1)
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    model.train()
    a, b = model(tokens), model(tokens)
    assert not torch.equal(a, b)
    torch.manual_seed(5)
    c = model(tokens)
    torch.manual_seed(5)
    assert torch.equal(c, model(tokens))  # reproducible from the RNG
    model.eval()
    assert torch.equal(model(tokens), model(tokens))


def test_causal():
    model = make("tiny-llama").eval()
    tokens = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[0, 6] = (changed[0, 6] + 1) % 256
    a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :6], b[:, :6], rtol=0, atol=0)
    assert not torch.allclose(a[:, 6:], b[:, 6:])


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-llama", "tiny-moe"])
def test_attention_with_column_sharded_heads(name):
    """Tensor parallelism by hand: each 'rank' holds half the q/k/v heads and half of o_proj's
    input columns; the attention module infers the local head count and the partial outputs sum
    to the full one."""
    model = make(name).eval()
    attn = model.layers["0"].attn
    spec = model.spec
    d, tp = spec.head_dim, 2
    x = torch.randn(2, 8, spec.hidden_size, generator=torch.Generator().manual_seed(0))
    rope = None
    if spec.family != "gpt":
        from autoparallel.models.layers import rope_cos_sin
        rope = rope_cos_sin(8, d, spec.rope_theta, x.device)
    full = attn(x, rope)
    total = torch.zeros_like(full)
    for r in range(tp):
        shard = copy.deepcopy(attn)
        for proj, heads in (("q_proj", spec.num_heads), ("k_proj", spec.num_kv_heads),
                            ("v_proj", spec.num_kv_heads)):
            lin = getattr(shard, proj)
            rows = slice(r * heads * d // tp, (r + 1) * heads * d // tp)
            new = nn.Linear(lin.in_features, rows.stop - rows.start, bias=lin.bias is not None)
            new.weight.data.copy_(lin.weight[rows])
            if lin.bias is not None:
                new.bias.data.copy_(lin.bias[rows])
            setattr(shard, proj, new)
        cols = slice(r * spec.num_heads * d // tp, (r + 1) * spec.num_heads * d // tp)
        o = nn.Linear(cols.stop - cols.start, spec.hidden_size, bias=False)
        o.weight.data.copy_(attn.o_proj.weight[:, cols])
        shard.o_proj = o
        total += shard(x, rope)
    if attn.o_proj.bias is not None:
        total += attn.o_proj.bias
    torch.testing.assert_close(total, full, rtol=1e-5, atol=1e-5)


def naive_moe(moe: MoE, x: torch.Tensor, norm_topk_prob: bool, mixtral_style: bool) -> torch.Tensor:
    """Per-token reference following the HF implementations."""
    B, S, h = x.shape
    xs = x.reshape(-1, h)
    logits = moe.router.gate(xs)
    k = moe.router.top_k
    if mixtral_style:  # Mixtral: softmax over the top-k logits
        top, idx = logits.topk(k, dim=-1)
        w = top.softmax(-1)
    else:  # Qwen: softmax over all, top-k, optionally renormalized
        w, idx = logits.softmax(-1).topk(k, dim=-1)
        if norm_topk_prob:
            w = w / w.sum(-1, keepdim=True)
    e = moe.experts
    out = torch.zeros_like(xs)
    for t in range(xs.shape[0]):
        for j in range(k):
            ex = idx[t, j]
            y = (F.silu(xs[t] @ e.w1[ex].T) * (xs[t] @ e.w3[ex].T)) @ e.w2[ex].T
            out[t] += w[t, j] * y
    if moe.shared_expert is not None:
        s = moe.shared_expert(xs)
        if moe.shared_expert_gate is not None:
            s = torch.sigmoid(moe.shared_expert_gate(xs)) * s
        out += s
    return out.view(B, S, h)


@pytest.mark.parametrize("norm_topk_prob,mixtral_style", [(False, False), (True, False), (True, True)])
def test_moe_matches_naive_reference(norm_topk_prob, mixtral_style):
    spec = load_model_spec("tiny-moe", norm_topk_prob=norm_topk_prob, num_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    moe = MoE(spec)
    for p in moe.parameters():
        nn.init.normal_(p, std=0.2)
    x = torch.randn(2, 5, spec.hidden_size, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(moe(x), naive_moe(moe, x, norm_topk_prob, mixtral_style), rtol=1e-5, atol=1e-5)


def test_moe_without_shared_expert_and_dense_layers():
    cfg = {"model_type": "mixtral", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_local_experts": 4, "num_experts_per_tok": 2}
    torch.manual_seed(0)
    model = build_model(load_model_spec(cfg))
    model.init_weights()
    moe = model.layers["1"].mlp
    assert moe.shared_expert is None and moe.shared_expert_gate is None
    x = torch.randn(1, 6, 32, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(moe(x), naive_moe(moe, x, True, True), rtol=1e-5, atol=1e-6)


def test_moe_deterministic_forward_backward():
    def run():
        model = make("tiny-moe", seed=11)
        tokens = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(4))
        loss = lm_loss(model(tokens), tokens)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    (l1, g1), (l2, g2) = run(), run()
    assert torch.equal(l1, l2)
    assert all(torch.equal(a, b) for a, b in zip(g1, g2, strict=True))


def test_grouped_experts_equal_per_expert_loop_with_empty_group():
    torch.manual_seed(0)
    ge = GroupedExperts(3, 8, 4)
    x = torch.randn(7, 8, requires_grad=True)
    counts = torch.tensor([2, 0, 5])
    out = ge(x, counts)
    grad = torch.randn_like(out)
    out.backward(grad)
    got = [x.grad.clone()] + [w.grad.clone() for w in (ge.w1, ge.w2, ge.w3)]
    x.grad = None
    ge.zero_grad()
    ref = torch.cat([(F.silu(x[:2] @ ge.w1[0].T) * (x[:2] @ ge.w3[0].T)) @ ge.w2[0].T,
                     (F.silu(x[2:] @ ge.w1[2].T) * (x[2:] @ ge.w3[2].T)) @ ge.w2[2].T])
    ref.backward(grad)
    torch.testing.assert_close(out, ref)
    for g, w in zip(got, [x] + [ge.w1, ge.w2, ge.w3], strict=True):
        torch.testing.assert_close(g, w.grad)
    assert torch.equal(got[1][1], torch.zeros_like(got[1][1]))  # the expert with no tokens gets none
    with torch.device("meta"):
        ge_meta = GroupedExperts(3, 8, 8).to(torch.bfloat16)  # the kernel wants 16-byte rows
        out = ge_meta(torch.empty(7, 8, dtype=torch.bfloat16), torch.empty(3, dtype=torch.long))
    assert out.is_meta and out.shape == (7, 8)


def test_grouped_experts_follow_autocast():
    ge = GroupedExperts(2, 8, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ge(torch.randn(6, 8), torch.tensor([4, 2]))
    assert out.dtype == torch.bfloat16


def test_compiled_moe_block_is_one_graph_under_autocast():
    """The trainer compiles each block under autocast: the experts' autocast query must not split the block
    (torch 2.11's Dynamo broke the graph at torch.amp.is_autocast_available: six graphs a block on the GPU).
    A graph recompiled when autocast's state changes, so the constant the query folds to is never stale."""
    import torch._dynamo as dynamo

    model = make("tiny-moe", seed=3)
    block = next(b for b in model.layers.values() if isinstance(b.mlp, MoE))
    h = block.mlp.router.gate.in_features
    x = torch.randn(2, 16, h)
    dynamo.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        explained = dynamo.explain(block)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)

    def cast(t):
        dtype = _autocast_dtype(t.device.type)
        return t if dtype is None else t.to(dtype)

    compiled = torch.compile(cast, backend="eager")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert compiled(x).dtype == torch.bfloat16
    assert compiled(x).dtype == torch.float32
    assert _autocast_dtype("meta") is None  # the tracer's device: no autocast there
    dynamo.reset()

    def unmarked():
        return None

    marked = dict(vars(torch.compiler.assume_constant_result(unmarked)))
    assert marked and vars(_autocast_dtype).items() >= marked.items()  # the public API's mark, set by hand


def test_load_model_catalog_and_callable(tmp_path, monkeypatch):
    with torch.device("meta"):
        model, spec = load_model("tiny-llama")
    assert spec is not None and spec.name == "tiny-llama" and next(model.parameters()).is_meta
    (tmp_path / "usermodels_ap.py").write_text(textwrap.dedent("""
        import torch.nn as nn
        def make():
            return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        def not_a_module():
            return 42
        def broken():
            raise RuntimeError("boom")
        NUMBER = 3
        class Net:
            @staticmethod
            def build():
                return nn.Linear(2, 2)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    model, spec = load_model("usermodels_ap:make")
    assert spec is None and isinstance(model, nn.Sequential)
    assert isinstance(load_model("usermodels_ap:Net.build")[0], nn.Linear)
    with pytest.raises(UserError, match="cannot import module 'no_such_mod_ap'"):
        load_model("no_such_mod_ap:make")
    with pytest.raises(UserError, match="has no attribute 'missing'"):
        load_model("usermodels_ap:missing")
    with pytest.raises(UserError, match="returned int, not a torch.nn.Module"):
        load_model("usermodels_ap:not_a_module")
    with pytest.raises(UserError, match="is not callable"):
        load_model("usermodels_ap:NUMBER")
    with pytest.raises(UserError, match=r"broken\(\) failed: RuntimeError: boom"):
        load_model("usermodels_ap:broken")


@pytest.mark.parametrize("name", TINY)
def test_bf16_forward(name):
    model = make(name).to(torch.bfloat16)
    tokens = torch.randint(0, model.spec.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    out = model(tokens)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    ref = make(name)(tokens)
    assert (out.float() - ref).abs().max() < 0.05 * ref.abs().max()


def test_moe_traces_under_fake_tensors_and_export():
    """The tracer runs models on meta/fake tensors: MoE routing must not need real counts. The experts are
    three grouped GEMMs with static shapes (no data-dependent split). bf16: aten._grouped_mm's meta kernel
    applies the CUDA kernel's dtype rule."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    spec = load_model_spec("tiny-moe", num_layers=1)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with FakeTensorMode():
            model = build_model(spec)
            out = model(torch.zeros(2, 8, dtype=torch.long))
            out.sum().backward()
    finally:
        torch.set_default_dtype(default)
    assert out.shape == (2, 8, spec.vocab_size)
    assert model.layers["0"].mlp.experts.w1.grad.shape == model.layers["0"].mlp.experts.w1.shape
    with torch.device("meta"):
        model = build_model(spec).to(torch.bfloat16)
    ep = torch.export.export(model, (torch.zeros(2, 8, dtype=torch.long, device="meta"),))
    targets = [str(n.target) for n in ep.graph.nodes]
    assert targets.count("aten._grouped_mm.default") == 3
    assert "aten.split_with_sizes.default" not in targets


HF_PARITY_CASES = [
    ("llama", dict(attention_bias=True, mlp_bias=True)),
    ("mistral", {}),
    ("qwen2", {}),
    ("qwen3", dict(head_dim=16, tie_word_embeddings=True)),
    ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2)),
    ("qwen2_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                       shared_expert_intermediate_size=24, decoder_sparse_step=2, mlp_only_layers=[2])),
    ("qwen3_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, head_dim=16,
                       norm_topk_prob=True)),
    ("gpt2", dict(n_embd=32, n_layer=2, n_head=4, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0,
                  attn_pdrop=0.0)),
]


def _hf_to_ours(key: str, value: torch.Tensor, gpt2: bool) -> dict[str, torch.Tensor]:
    """Rename a transformers state-dict entry to this project's layout."""
    if gpt2:
        if key.endswith((".attn.bias", ".attn.masked_bias")):
            return {}
        k = key.removeprefix("transformer.").replace("wte", "tok_embeddings").replace("wpe", "pos_embeddings")
        k = k.replace("ln_f", "norm").replace("h.", "layers.", 1).replace("ln_1", "attn_norm")
        k = k.replace("ln_2", "mlp_norm")
        conv = value.T if k.endswith("weight") and value.ndim == 2 and "embeddings" not in k else value
        if "c_attn" in k:  # Conv1D [in, 3 out] -> q, k, v Linear
            parts = value.chunk(3, dim=-1)
            return {k.replace("c_attn", f"{n}_proj"): (p.T if k.endswith("weight") else p)
                    for n, p in zip("qkv", parts, strict=True)}
        for old, new in (("attn.c_proj", "attn.o_proj"), ("mlp.c_fc", "mlp.up_proj"),
                         ("mlp.c_proj", "mlp.down_proj")):
            if old in k:
                return {k.replace(old, new): conv}
        return {k: value}
    k = key.removeprefix("model.").replace("embed_tokens", "tok_embeddings").replace("self_attn", "attn")
    k = k.replace("input_layernorm", "attn_norm").replace("post_attention_layernorm", "mlp_norm")
    k = k.replace("mlp.gate.weight", "mlp.router.gate.weight")
    if k.endswith("experts.gate_up_proj"):  # [E, 2f, h]: gate rows then up rows
        f = value.shape[1] // 2
        return {k.replace("gate_up_proj", "w1"): value[:, :f], k.replace("gate_up_proj", "w3"): value[:, f:]}
    if k.endswith("experts.down_proj"):
        return {k.replace("down_proj", "w2"): value}
    return {k: value}


@pytest.mark.parametrize("model_type,extra", HF_PARITY_CASES, ids=[c[0] for c in HF_PARITY_CASES])
def test_logits_match_hf_transformers(model_type, extra):
    """With transformers installed (not a dependency): same weights, same logits, same count;
    the config goes through transformers' own JSON serialization."""
    transformers = pytest.importorskip("transformers")
    import json

    base = {} if model_type == "gpt2" else dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                                num_attention_heads=4, num_key_value_heads=2,
                                                rope_theta=123456.0)
    cfg = transformers.AutoConfig.for_model(model_type, vocab_size=64, **base, **extra)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    for p in hf.parameters():
        nn.init.normal_(p, std=0.3)
    spec = load_model_spec(json.loads(cfg.to_json_string()))
    ours = build_model(spec).eval()
    state = {}
    for k, v in hf.state_dict().items():
        state.update(_hf_to_ours(k, v, model_type == "gpt2"))
    missing, unexpected = ours.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= ({"lm_head.weight"} if spec.tie_word_embeddings else set())
    ours.tie_weights()
    assert sum(p.numel() for p in hf.parameters()) == parameter_count(spec)
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), hf(tokens).logits, rtol=1e-5, atol=1e-5)
