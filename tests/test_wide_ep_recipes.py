"""The peers' wide-EP recipes as golden tests (issue 18 Build 5).

Each recipe (KServe's DeepSeek-R1-0528 DP32+EP sample, llm-d's wide-EP guide, Dynamo's DEP16 recipe; URL and
commit in benchmarks/wide_ep_recipes.py and in each tests/fixtures/recipes/*.yaml) is an LLMDeployment pinned
to its layout. Rendered on the hgx-h200-ib fleet, every pod's vLLM arguments must equal the recipe's, row by
row of the equivalence table (their flag -> our flag and value); the differences are listed there with the
reason. Beside it meshplan's automatic choice on the same hardware is planned: it must render, and its reason
must compare it with the recipe's kind of layout (single-domain and wide EP, with figures).
"""

from __future__ import annotations

import pytest

from benchmarks.wide_ep_recipes import RECIPES, auto_plan, render_pinned, topology

IDS = [r.file.removesuffix(".yaml") for r in RECIPES]


@pytest.fixture(scope="module", params=RECIPES, ids=IDS)
def rendered(request):
    recipe = request.param
    choice, pods = render_pinned(recipe)
    return recipe, choice, pods


def test_every_row_of_the_equivalence_table_holds_on_every_pod(rendered):
    recipe, choice, pods = rendered
    assert len(pods) == recipe.pods, (recipe.name, len(pods))
    assert recipe.table and recipe.differences
    for theirs, their_value, ours, our_value in recipe.table:
        for i, flags in enumerate(pods):
            if our_value is None:
                assert ours not in flags, (recipe.name, theirs, i)
            else:
                assert flags.get(ours) == our_value, (recipe.name, theirs, ours, i, flags.get(ours))


def test_the_pinned_plan_is_the_recipes_layout(rendered):
    recipe, choice, pods = rendered
    dp = int(next(t[3] for t in recipe.table if t[2] == "--data-parallel-size"))
    assert (choice.layout.tp, choice.layout.ep, choice.layout.pp) == (1, dp, 1)
    assert choice.a2a_backend in ("deepep-normal", "deepep-low-latency")
    # workers are headless with their start rank; the leader serves the API
    assert "--headless" not in pods[0] and all("--headless" in p for p in pods[1:])
    assert [int(p.get("--data-parallel-start-rank", 0)) for p in pods] == [8 * i for i in range(len(pods))]


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_meshplans_own_choice_renders_and_says_why_against_the_recipes_kind(recipe):
    from meshplan.api.models import LLMDeployment
    from meshplan.render.pipeline import plan_place_render

    plan = auto_plan(recipe)
    c = plan.choice
    assert c is not None, plan.reason
    topo_line = plan.extra["topology"]
    # the explanation names both alternatives with their predicted figures
    assert "inside one NVLink domain" in topo_line and "wide EP across NVLink domains" in topo_line
    assert topo_line.count("tokens/s/GPU") == 2, topo_line
    recipe_ep = int(next(t[3] for t in recipe.table if t[2] == "--data-parallel-size"))
    if c.layout.gpus_per_stage != recipe_ep:
        # it chose another layout than the recipe: the reason says what it gains (the objective's figure)
        assert "the most tokens/s/GPU" in plan.reason
        best_wide = topo_line.split("wide EP across NVLink domains of one RDMA network block: ")[1]
        wide_tps = float(best_wide.split(" tokens/s/GPU")[0].split(": ")[-1].replace(",", ""))
        assert c.prediction.tokens_per_s_per_gpu >= wide_tps
    # and it renders on the same fleet
    import copy

    from benchmarks.wide_ep_recipes import _manifest

    m = copy.deepcopy(_manifest(recipe))
    m["spec"]["parallelism"] = {k: v for k, v in m["spec"]["parallelism"].items() if k == "maxNumSeqs"}
    m["spec"]["engine"].update(allToAll="auto", batchOverlap="auto")
    m["spec"]["gpus"]["maxGpus"] = 32
    m["spec"].pop("replicas", None)
    res = plan_place_render(LLMDeployment.from_manifest(m), topology(), plan=plan)
    assert res.rendered is not None and res.placement.ok, res.message
