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
])
def test_mesh_span(kw, expected):
    assert _plan(**kw).mesh_span() == expected


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
