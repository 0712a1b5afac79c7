"""The chart value gpuCatalog reaches the operator: a ConfigMap mounted into the Deployment and read at start
by `meshplan run --gpu-catalog` (the same loader as `meshplan plan --gpu-catalog`). Needs the real helm that
e2e/build-control-plane.sh builds (skipped, and not counted, without it, like tests/test_chart_render.py)."""

from __future__ import annotations

import yaml

from meshplan.catalog.gpus import clear_custom_gpus, get_gpu, load_gpu_catalog
from meshplan.cli import main
from tests.test_chart_render import container, one, render, render_error

FOO = {"name": "foo_96gb", "productLabels": ["NVIDIA-Foo-96GB"], "memoryGiB": 96, "memoryBandwidthTBs": 3.35,
       "tflops": {"bf16": 989, "fp8": 1979}, "nvlinkGBs": 900, "nvlinkDomain": 8,
       "source": "illustrative test declaration"}


def test_no_catalogue_by_default():
    docs = render()
    assert not [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("gpu-catalog")]
    assert "--gpu-catalog" not in container(docs, "Deployment")["args"]


def test_gpu_catalog_value_is_mounted_and_read_by_the_operator(tmp_path):
    docs = render({"gpuCatalog": [FOO]})
    cm = one(docs, "ConfigMap", "gpu-catalog")
    c = container(docs, "Deployment")
    args = c["args"]
    path = args[args.index("--gpu-catalog") + 1]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "gpu-catalog")
    assert path == f"{mount['mountPath']}/gpus.yaml" and mount["readOnly"]
    dep = one(docs, "Deployment")
    vol = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "gpu-catalog")
    assert vol["configMap"]["name"] == cm["metadata"]["name"]
    assert dep["spec"]["template"]["metadata"]["annotations"]["meshplan.dev/gpu-catalog-checksum"]
    # the file the operator reads is what the loader accepts
    f = tmp_path / "gpus.yaml"
    f.write_text(cm["data"]["gpus.yaml"])
    try:
        assert [g.name for g in load_gpu_catalog(str(f))] == ["foo_96gb"]
        assert get_gpu("NVIDIA-Foo-96GB").memory_gib == 96
    finally:
        clear_custom_gpus()


def test_the_schema_refuses_an_incomplete_declaration_naming_the_field():
    err = render_error({"gpuCatalog": [{"name": "x", "productLabels": ["X"], "memoryGiB": 1}]})
    assert "gpuCatalog" in err and "memoryBandwidthTBs" in err


def test_meshplan_run_stops_on_a_bad_catalogue_naming_the_field(tmp_path, capsys):
    bad = tmp_path / "gpus.yaml"
    bad.write_text(yaml.safe_dump({"gpus": [{**FOO, "tflops": {"bf17": 1}}]}))
    assert main(["run", "--all-namespaces", "--gpu-catalog", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "gpus[0]" in err and "tflops" in err
