"""Prefill/decode disaggregation, the engine-rendering part (issue 19): `engines.base.Disaggregation` on
`ServingOptions.disagg` makes each engine module render its role's flags; None (aggregated) renders exactly what it
did before (the golden files, byte-identical: tests/test_render_golden.py, and here the same scenarios compared
object by object). The engines' own parsers check the role command lines in tests/conformance/ (test_vllm.py,
test_sglang.py, test_trtllm.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml
from test_render_golden import NEW_ENGINE_IMAGES, NEW_ENGINE_SCENARIOS, SCENARIOS, _MEM, _PRED, render_scenario

from meshplan.catalog.models import get_model
from meshplan.engines import sglang, trtllm, vllm
from meshplan.engines.base import Disaggregation, RenderError
from meshplan.placement import place, request_for_layout
from meshplan.planner.types import Candidate
from meshplan.render import Owner, PodOptions, plan_hash, render_deployment
from meshplan.render.engine_args import ServingOptions
from meshplan.topology import build_topology

ENGINES = ("vllm", "sglang", "trtllm")


def _render(engine: str, fleet: str, disagg: Disaggregation | None) -> list[dict]:
    """render_scenario (the golden files' inputs) with `ServingOptions.disagg` set."""
    scenario = SCENARIOS.get(fleet) or NEW_ENGINE_SCENARIOS[fleet]
    nodes, per_node, product, layout, wd, kvd, chunk, seqs, model, ckpt, network = scenario
    topo = build_topology(nodes)
    placement = place(request_for_layout(layout, per_node, product=product), topo)
    cand = Candidate(layout=layout, weight_dtype=wd, kv_dtype=kvd, chunk_size=chunk, max_num_seqs=seqs,
                     memory=_MEM, prediction=_PRED, engine=engine)
    arch = get_model(model)
    serving = ServingOptions(engine=engine, model=model, served_name=model.split("/")[-1].lower(),
                             checkpoint_dtype=ckpt, max_model_len=1280, num_experts=arch.num_experts,
                             model_name=arch.name, disagg=disagg)
    pods = PodOptions(weights_secret=("hf-token", "token"), image=NEW_ENGINE_IMAGES.get(engine))
    out = render_deployment(Owner("llm", "serving", "0b9e4c1a-5f6d-4e1a-9c1b-1234567890ab"), cand, placement,
                            topo, serving, network, pods)
    return out.objects


def _pods(objects: list[dict]) -> list[dict]:
    return [o for o in objects if o.get("kind") == "Pod"]


def _engine_container(pod: dict) -> dict:
    return pod["spec"]["containers"][0]


@pytest.mark.parametrize("fleet", sorted(SCENARIOS))
@pytest.mark.parametrize("engine", ENGINES)
def test_aggregated_render_is_unchanged(engine: str, fleet: str) -> None:
    """disagg None is today's render, object for object (the golden files hold the same)."""
    assert _render(engine, fleet, None) == render_scenario(engine, fleet)


@pytest.mark.parametrize("fleet", sorted(SCENARIOS))
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_each_role_renders_its_flags_and_only_them(engine: str, fleet: str, role: str) -> None:
    """A role's pods are the aggregated pods plus the role's settings: every aggregated argument is still there,
    the added ones are exactly the engine module's `disagg_flags`, and the plan hash differs (a role's groups
    roll on their own)."""
    disagg = Disaggregation(role, ib_devices=("mlx5_0", "mlx5_1"))
    agg, pd = _pods(render_scenario(engine, fleet)), _pods(_render(engine, fleet, disagg))
    assert len(agg) == len(pd)
    for a, p in zip(agg, pd):
        ca, cp = _engine_container(a), _engine_container(p)
        assert p["metadata"]["labels"]["meshplan.dev/plan-hash"] != a["metadata"]["labels"]["meshplan.dev/plan-hash"]
        if engine == "trtllm":
            if cp["args"][1] == trtllm.TRTLLM_SSHD_SCRIPT_NAME:      # an MPI worker pod: no engine of its own
                assert cp["args"] == ca["args"]
                continue
            opts_a = yaml.safe_load(ca["args"][0].split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0])
            opts_p = yaml.safe_load(cp["args"][0].split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0])
            added = {k: v for k, v in opts_p.items() if k not in opts_a}
            assert {k: v for k, v in opts_p.items() if k in opts_a} == opts_a
            assert added == trtllm.disagg_flags(disagg, None, [], 1280)
            assert cp["args"][1:] == ca["args"][1:]
            continue
        args_a, args_p = list(ca["args"]), list(cp["args"])
        flags = (vllm if engine == "vllm" else sglang).disagg_flags(disagg, None, [])
        rendered = [x for k, v in flags.items() for x in (k, str(v))]
        i = args_p.index(rendered[0])
        assert args_p[i:i + len(rendered)] == rendered
        assert args_p[:i] + args_p[i + len(rendered):] == args_a
        ports = {x["name"]: x["containerPort"] for x in cp.get("ports", [])}
        if engine == "sglang" and role == "prefill" and a["metadata"]["labels"]["meshplan.dev/role"] == "leader":
            assert ports["bootstrap"] == sglang.SGLANG_BOOTSTRAP_PORT
        if engine == "vllm":
            env = {e["name"]: e for e in cp["env"]}
            assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom":
                                                          {"fieldRef": {"fieldPath": "status.podIP"}}}
            assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"] == "5600"
            assert any(n.startswith("nixl-") for n in ports), ports
            assert {e["name"] for e in cp["env"]} - {e["name"] for e in ca["env"]} == \
                {"VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT"}


def test_vllm_roles_are_producer_and_consumer_with_the_connector_asked() -> None:
    for role, kv in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        for backend, connector in (("", "NixlConnector"), ("mooncake", "MooncakeConnector"),
                                   ("lmcache", "LMCacheConnectorV1")):
            flags = vllm.disagg_flags(Disaggregation(role, backend), None, [])
            assert json.loads(flags["--kv-transfer-config"]) == {"kv_connector": connector, "kv_role": kv}


def test_sglang_backend_follows_the_pods_rdma_devices() -> None:
    tcp = sglang.disagg_flags(Disaggregation("decode"), None, [])
    assert tcp == {"--disaggregation-mode": "decode", "--disaggregation-transfer-backend": "mooncake_tcp"}
    ib = sglang.disagg_flags(Disaggregation("prefill", ib_devices=("mlx5_0", "mlx5_3")), None, [])
    assert ib == {"--disaggregation-mode": "prefill", "--disaggregation-transfer-backend": "mooncake",
                  "--disaggregation-bootstrap-port": 8998, "--disaggregation-ib-device": "mlx5_0,mlx5_3"}
    # mori (AMD) has no IB-device flag in SGLang ("Supported by Mooncake and NIXL UCX")
    mori = sglang.disagg_flags(Disaggregation("decode", "mori", ib_devices=("mlx5_0",)), None, [])
    assert "--disaggregation-ib-device" not in mori


@pytest.mark.parametrize("module", [vllm, sglang, trtllm])
def test_an_unknown_transfer_backend_is_refused_with_the_choices(module) -> None:
    with pytest.raises(RenderError, match="disaggregation transfer backend 'p2pnccl'.*choose one of them") as exc:
        module.disagg_flags(Disaggregation("prefill", "p2pnccl"), None, [])
    for name in module.DISAGG_TRANSFER_BACKENDS:
        assert name in str(exc.value)


def test_a_role_must_be_prefill_or_decode() -> None:
    with pytest.raises(ValueError, match="role 'both'"):
        Disaggregation("both")


@pytest.mark.parametrize("engine", ["nim", "deepspeed"])
def test_engines_without_disaggregation_refuse_a_role(engine: str) -> None:
    with pytest.raises(RenderError, match="no prefill/decode disaggregation"):
        _render(engine, "hgx-h100-tp2", Disaggregation("prefill"))


def test_plan_hash_ignores_an_unset_role_and_tells_roles_apart() -> None:
    """The hash of an aggregated group is what it was before the field existed (no rollout on upgrade); prefill and
    decode groups of the same layout hash differently."""
    from meshplan.render import NetworkOptions

    cand = Candidate(layout=SCENARIOS["l40s"][3], weight_dtype="fp8", kv_dtype="bf16", chunk_size=512,
                     max_num_seqs=64, memory=_MEM, prediction=_PRED, engine="vllm")
    base = ServingOptions(engine="vllm", model="m")
    hashes = {plan_hash(cand, dataclasses.replace(base, disagg=d), NetworkOptions(), PodOptions(), 4, 1)
              for d in (None, Disaggregation("prefill"), Disaggregation("decode"))}
    assert len(hashes) == 3
    assert plan_hash(cand, base, NetworkOptions(), PodOptions(), 4, 1) in hashes


@pytest.mark.parametrize("module", [vllm, sglang, trtllm])
def test_a_router_needs_both_roles(module) -> None:
    with pytest.raises(RenderError, match="at least one prefill and one decode"):
        module.router_command([], ["d:8000"])


def test_vllm_router_argv_lists_every_endpoint_in_order_for_the_roles_connector() -> None:
    cmd, args = vllm.router_command(["p0:8000", "p1:8001"], ["d0:8000"], port=9000)
    assert cmd == ("vllm-router",)
    assert list(args) == ["--host", "0.0.0.0", "--port", "9000", "--vllm-pd-disaggregation", "--kv-connector", "nixl",
                          "--prefill", "http://p0:8000", "--prefill", "http://p1:8001", "--decode", "http://d0:8000"]
    _, moon = vllm.router_command(["p0:8000"], ["d0:8000"],
                                  disagg=Disaggregation(role="decode", transfer_backend="mooncake", bootstrap_port=9123))
    assert moon[moon.index("--kv-connector") + 1] == "mooncake"
    assert moon[moon.index("--prefill") + 1:moon.index("--prefill") + 3] == ("http://p0:8000", "9123")
    with pytest.raises(RenderError, match="expected host:port"):
        vllm.router_command(["p0"], ["d0:8000"])
    with pytest.raises(RenderError, match="nixl and mooncake connectors only"):
        vllm.router_command(["p0:8000"], ["d0:8000"], disagg=Disaggregation(role="prefill", transfer_backend="lmcache"))
