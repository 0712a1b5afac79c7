"""The generated CRD: no drift from the models, structural, documented, bounded.

The API server enforces most of these (structural schema, CEL cost); checking
them here catches a bad model change in a second instead of in the e2e suite.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from meshplan.api import crd as crdmod
from meshplan.api import models

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def crd() -> dict:
    return crdmod.build_crd()


@pytest.fixture(scope="module")
def root(crd) -> dict:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_crd_files_match_the_models():
    stale = crdmod.drifted(REPO)
    assert not stale, f"run `meshplan crd generate`: {', '.join(map(str, stale))} differ from the models"


def test_crd_check_command_reports_drift(tmp_path, capsys):
    from meshplan.commands.crd import run

    class Args:
        action = "check"
        root = str(tmp_path)

    assert run(Args()) == 1  # nothing generated there yet
    Args.action = "generate"
    assert run(Args()) == 0
    Args.action = "check"
    assert run(Args()) == 0
    (tmp_path / crdmod.CRD_PATHS[1]).write_text("# edited by hand\n")
    assert run(Args()) == 1
    assert "charts/meshplan/crds" in capsys.readouterr().err


def test_rendered_yaml_parses_back_to_the_same_crd(crd):
    assert yaml.safe_load(crdmod.render_crd()) == crd


def test_names_and_subresources(crd, root):
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "llmdeployments.meshplan.dev"
    assert spec["names"]["shortNames"] == ["llmd"] and spec["scope"] == "Namespaced"
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1" and version["storage"] is True
    scale = version["subresources"]["scale"]
    assert "status" in version["subresources"]
    for key in ("specReplicasPath", "statusReplicasPath", "labelSelectorPath"):
        assert _lookup(root, scale[key]) is not None, f"{key} {scale[key]} is not in the schema"
    assert _lookup(root, scale["specReplicasPath"])["type"] == "integer"
    assert _lookup(root, scale["labelSelectorPath"])["type"] == "string"


def test_printer_columns_point_at_fields_that_exist(crd, root):
    for col in crd["spec"]["versions"][0]["additionalPrinterColumns"]:
        path = re.sub(r"\[\?\(.*\)\]", "[]", col["jsonPath"])
        if path.startswith(".metadata"):
            continue
        assert _lookup(root, path) is not None, f"printer column {col['name']}: {col['jsonPath']} not in the schema"
    names = [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert names[:2] == ["Model", "Layout"] and "Age" in names


def _lookup(schema: dict, json_path: str):
    node = schema
    for part in json_path.strip(".").split("."):
        if part.endswith("[]"):
            node = (node.get("properties") or {}).get(part[:-2])
            node = node and node.get("items")
        else:
            node = (node.get("properties") or {}).get(part)
        if node is None:
            return None
    return node


def _all(root):
    yield "", root
    yield from crdmod.iter_properties(root)


def test_schema_is_structural(root):
    for path, node in _all(root):
        assert "$ref" not in node and "anyOf" not in node and "oneOf" not in node and "allOf" not in node, path
        assert "title" not in node and "additionalProperties" not in node or isinstance(node.get("additionalProperties"), dict), path
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node, path
        elif path != ".metadata":
            assert node.get("type") in {"object", "array", "string", "integer", "number", "boolean"}, path
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, path


def test_every_spec_and_status_field_has_a_description(root):
    missing = [p for p, n in crdmod.iter_properties(root) if p != ".metadata" and not n.get("description")
               and not p.endswith("[]") and not p.endswith("{}")]
    assert not missing, f"fields without description: {missing}"


def test_every_string_list_and_map_is_bounded(root):
    """Unbounded strings/lists make the API server's CEL cost estimate explode."""
    unbounded = []
    for path, node in crdmod.iter_properties(root):
        if not (path.startswith(".spec") or path.startswith(".status")):
            continue
        kind = node.get("type")
        if kind == "string" and "maxLength" not in node and "enum" not in node and node.get("format") != "date-time":
            unbounded.append(path)
        if kind == "array" and "maxItems" not in node:
            unbounded.append(path)
        if kind == "object" and isinstance(node.get("additionalProperties"), dict) and "maxProperties" not in node:
            unbounded.append(path)
    assert not unbounded, unbounded


def test_list_map_keys_are_required(root):
    for path, node in crdmod.iter_properties(root):
        if node.get("x-kubernetes-list-type") == "map":
            required = set(node["items"].get("required", []))
            assert set(node["x-kubernetes-list-map-keys"]) <= required, path


def test_cel_rules_have_messages_and_field_paths_that_exist(root):
    count = 0
    for path, node in _all(root):
        for rule in node.get("x-kubernetes-validations", []):
            count += 1
            assert rule["message"], (path, rule)
            assert "\n" not in rule["rule"]
            if "fieldPath" in rule:
                assert _lookup(node, rule["fieldPath"]) is not None, (path, rule)
            if "reason" in rule:
                assert rule["reason"] in {"FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate"}
    declared = sum(len(cls.__dict__.get("RULES", ())) for cls in _api_models())
    assert count >= declared > 15


def _api_models():
    return [v for v in vars(models).values() if isinstance(v, type) and issubclass(v, models.ApiModel)]


def test_every_declared_rule_is_in_the_crd(root):
    rules_in_crd = {r["rule"] for _, n in _all(root) for r in n.get("x-kubernetes-validations", [])}
    for cls in _api_models():
        for rule in cls.__dict__.get("RULES", ()):
            assert rule.cel in rules_in_crd, f"{cls.__name__}: {rule.message}"


def test_sections_default_to_empty_objects_so_nested_defaults_apply(root):
    spec = root["properties"]["spec"]
    for name in ("precision", "engine", "workload", "parallelism", "gpus", "autoscaling", "nccl"):
        assert spec["properties"][name]["default"] == {}, name
    assert spec["properties"]["engine"]["properties"]["prefixCaching"]["default"] is True
    assert spec["required"] == ["model"]


def test_auto_or_int_fields_are_int_or_string_with_a_cel_guard(root):
    par = root["properties"]["spec"]["properties"]["parallelism"]["properties"]
    for name in ("tensor", "expert", "pipeline", "chunkSize", "maxNumSeqs"):
        node = par[name]
        assert node["x-kubernetes-int-or-string"] is True and node["default"] == "auto"
        assert any("'auto'" in r["rule"] for r in node["x-kubernetes-validations"]), name


def test_plan_flag_regex_in_the_crd_is_the_one_the_models_use(root):
    engine = root["properties"]["spec"]["properties"]["engine"]
    rules = " ".join(r["rule"] for r in engine["x-kubernetes-validations"])
    assert models.PLAN_OWNED_FLAG_RE in rules
