"""The deployment files validate (docs/deploy.md#compose, #kubernetes): each Kubernetes overlay, rendered by
kustomize (``kubectl kustomize``), against the API schemas of Kubernetes 1.37 with unknown fields refused
(``kubernetes-validate --strict``); ``deploy/compose.yaml`` through Debian's ``docker-compose config`` (the compose
file format's schema; no daemon needed), and its mado services run the image's sub-commands."""

import copy
import os
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES_VERSION = "1.37.0"
SUB_COMMANDS = {"web", "worker", "beat", "migrate", "createsuperuser", "demo", "manage"}


def require_tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed (.ci/run installs it)")
        pytest.skip(f"{name} is not installed")
    return found


def rendered(overlay: str) -> list[dict]:
    kubectl = require_tool("kubectl")
    out = subprocess.run(
        [kubectl, "kustomize", str(ROOT / "deploy" / "kubernetes" / "overlays" / overlay)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_each_overlay_validates_against_the_kubernetes_api_schemas(overlay):
    resources = rendered(overlay)
    for resource in resources:
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)
    kinds = sorted({(r["kind"], r["metadata"]["name"].split("-")[-1]) for r in resources})
    assert ("Job", "migrate") in kinds and ("Ingress", "web") in kinds and ("Deployment", "beat") in kinds
    assert ("Deployment", "gpu") in kinds if overlay == "gpu" else ("Deployment", "gpu") not in kinds
    beat = next(r for r in resources if r["metadata"]["name"] == "mado-beat")
    assert (beat["spec"]["replicas"], beat["spec"]["strategy"]["type"]) == (1, "Recreate")
    for resource in resources:
        spec = resource.get("spec", {}).get("template", {}).get("spec")
        if spec:
            assert spec["securityContext"]["runAsNonRoot"] is True
            for container in spec["containers"]:
                assert container["args"][0] in SUB_COMMANDS


def test_the_schema_check_refuses_a_wrong_manifest():
    web = copy.deepcopy(next(r for r in rendered("cpu") if r["kind"] == "Deployment"))
    web["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(web, KUBERNETES_VERSION, strict=True)
    web["spec"]["replicas"] = 2
    web["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(web, KUBERNETES_VERSION, strict=True)


def compose_config(path: Path) -> subprocess.CompletedProcess:
    compose = require_tool("docker-compose")
    env = {**os.environ, "MADO_SECRET_KEY": "compose-check-secret"}
    return subprocess.run([compose, "-f", str(path), "config"], capture_output=True, text=True, env=env)


def test_the_compose_stack_validates_and_runs_the_image_sub_commands(tmp_path):
    checked = compose_config(ROOT / "deploy" / "compose.yaml")
    assert checked.returncode == 0, checked.stderr
    services = yaml.safe_load(checked.stdout)["services"]
    mado = {name: s for name, s in services.items() if "mado" in s["image"]}
    assert set(mado) == {"migrate", "web", "worker", "maintenance-worker", "gpu-worker", "beat"}
    assert {s["command"][0] for s in mado.values()} == {"migrate", "web", "worker", "beat"}
    assert all(s["command"][1:3] == ["--queues", s["command"][2]] for s in mado.values() if s["command"][0] == "worker")
    assert services["gpu-worker"]["profiles"] == ["gpu"]
    assert all("healthcheck" in services[name] for name in ("postgres", "redis", "minio", "web"))
    # the check is a real one: a misspelt key fails it
    broken = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    broken["services"]["web"]["healthchek"] = broken["services"]["web"].pop("healthcheck")
    (tmp_path / "compose.yaml").write_text(yaml.safe_dump(broken))
    assert compose_config(tmp_path / "compose.yaml").returncode != 0
