"""The Plan dataclass: mesh placement on nodes, validation, file round trip."""

from __future__ import annotations

import pytest

from autoparallel.errors import UserError
from autoparallel.plan import Plan


def _plan(**kw) -> Plan:
    base = dict(model="m", hardware="h100-sxm", gpus=64, gpus_per_node=8, global_batch=64, seq_len=128)
    base.update(kw)
    return Plan(**base)


@pytest.mark.parametrize("kw,expected", [
    (dict(dp=4, tp=2, pp=8), {"pp": "inter", "dp": "intra", "cp": "intra", "ep": "intra", "tp": "intra"}),
    (dict(dp=8, tp=8, pp=1), {"pp": "intra", "dp": "inter", "cp": "intra", "ep": "intra", "tp": "intra"}),
    (dict(gpus=48, dp=1, tp=6, pp=8), {"pp": "inter", "dp": "intra", "cp": "intra", "ep": "intra", "tp": "inter"}),  # 6 straddles nodes
    (dict(dp=2, ep=4, tp=1, pp=8), {"pp": "inter", "dp": "intra", "cp": "intra", "ep": "intra", "tp": "intra"}),
    # one node, partly filled: every group is inside it (dp 6 was priced across nodes)
    (dict(gpus=6, dp=6), {"pp": "intra", "dp": "intra", "cp": "intra", "ep": "intra", "tp": "intra"}),
    (dict(gpus=6, dp=2, tp=3), {"pp": "intra", "dp": "intra", "cp": "intra", "ep": "intra", "tp": "intra"}),
])
def test_mesh_span(kw, expected):
    assert _plan(**kw).mesh_span() == expected


def _ranks_per_node_by_enumeration(plan: Plan, dims: tuple[str, ...]) -> int:
    """Every rank's mesh coordinates (last of MESH_DIMS fastest), the group of rank 0 over `dims` (the other
    coordinates 0), counted on node 0: the layout torch's DeviceMesh(arange(gpus).reshape(shape)) makes."""
    import itertools

    from autoparallel.plan import MESH_DIMS
    shape = [plan.mesh_shape[d] for d in MESH_DIMS]
    group = [r for r, coords in enumerate(itertools.product(*map(range, shape)))
             if all(c == 0 for c, d in zip(coords, MESH_DIMS) if d not in dims)]
    return sum(r < plan.gpus_per_node for r in group)


@pytest.mark.parametrize("kw", [dict(dp=64), dict(dp=8, tp=8), dict(dp=32, tp=2), dict(dp=2, ep=4, tp=1, pp=8),
                                dict(dp=4, ep=2, tp=8), dict(gpus=48, dp=1, tp=6, pp=8), dict(dp=16, cp=2, tp=2),
                                dict(gpus=24, gpus_per_node=4, dp=3, tp=8), dict(dp=8, pp=8)])
@pytest.mark.parametrize("dims", [("dp", "cp", "ep"), ("dp", "cp"), ("tp",), ("ep",)])
def test_ranks_per_node_counts_a_groups_ranks_on_one_node(kw, dims):
    plan = _plan(**kw)
    assert plan.ranks_per_node(dims) == _ranks_per_node_by_enumeration(plan, dims)


def test_validate_names_the_field():
    with pytest.raises(UserError, match="does not equal gpus"):
        _plan(dp=3, tp=2, pp=8).validate()
    with pytest.raises(UserError, match="not divisible"):
        _plan(dp=8, tp=8, micro_batch=3).validate()
    with pytest.raises(UserError, match="vpp > 1 needs pp > 1"):
        _plan(dp=8, tp=8, vpp=2).validate()
    with pytest.raises(UserError, match="recompute mode"):
        _plan(dp=64, recompute=("sometimes",)).validate()


def test_round_trip_yaml_and_json(tmp_path):
    p = _plan(dp=4, tp=2, pp=8, vpp=2, recompute=("full",) * 16, stage_layers=(1,) * 16,
              placements={"layers.0.attn.q_proj": "colwise"})
    for name in ("p.yaml", "p.json"):
        p.save(tmp_path / name)
        assert Plan.load(tmp_path / name) == p
    (tmp_path / "bad.yaml").write_text("plan: {gpus: 8}")
    with pytest.raises(UserError, match="missing field"):
        Plan.load(tmp_path / "bad.yaml")
