"""The deployment files validate (docs/deploy.md#compose, #kubernetes): each Kubernetes overlay, rendered by
kustomize (``kubectl kustomize``), against the API schemas of Kubernetes 1.37 with unknown fields refused
(``kubernetes-validate --strict``); ``deploy/compose.yaml`` through Debian's ``docker-compose config`` (the compose
file format's schema; no daemon needed), and its mado services run the image's sub-commands. Every pod spec passes
the Pod Security Standards' "restricted" profile (https://kubernetes.io/docs/concepts/security/pod-security-standards/,
checked by ``tests.deploy.pod_security``) with a read-only root and cpu and memory requests and limits, and runs
the images ``deploy/build-image.sh`` builds at pyproject.toml's version."""

import copy
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.deploy.pod_security import containers, violations

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES_VERSION = "1.37.0"
SUB_COMMANDS = {"web", "worker", "beat", "migrate", "createsuperuser", "demo", "manage"}
IMAGE_VARIABLES = ("MADO_IMAGE", "MADO_WORKER_IMAGE", "MADO_GPU_WORKER_IMAGE")


def require_tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed (.ci/run installs it)")
        pytest.skip(f"{name} is not installed")
    return found


def rendered(overlay: str | Path) -> list[dict]:
    """The objects ``kubectl kustomize`` renders from an overlay's name or a kustomization's folder."""
    kubectl = require_tool("kubectl")
    folder = overlay if isinstance(overlay, Path) else ROOT / "deploy" / "kubernetes" / "overlays" / overlay
    out = subprocess.run([kubectl, "kustomize", str(folder)], check=True, capture_output=True, text=True).stdout
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
    env = {k: v for k, v in os.environ.items() if k not in IMAGE_VARIABLES} | {"MADO_SECRET_KEY": "compose-check"}
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
    assert {s["image"] for s in mado.values()} <= built_images()  # by default, the images of this release
    # the check is a real one: a misspelt key fails it
    broken = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    broken["services"]["web"]["healthchek"] = broken["services"]["web"].pop("healthcheck")
    (tmp_path / "compose.yaml").write_text(yaml.safe_dump(broken))
    assert compose_config(tmp_path / "compose.yaml").returncode != 0


def built_images() -> set[str]:
    """The tags ``deploy/build-image.sh`` gives by default (its ``--tags``: it builds nothing)."""
    env = {k: v for k, v in os.environ.items() if k not in IMAGE_VARIABLES}
    done = subprocess.run(
        ["bash", str(ROOT / "deploy" / "build-image.sh"), "--tags"], capture_output=True, text=True, env=env, check=True
    )
    return set(done.stdout.split())


def pod_specs(resources: list[dict]) -> dict[str, dict]:
    """Each workload's pod spec by its name: Deployments', Jobs' and CronJobs' templates."""
    found = {}
    for resource in resources:
        spec = resource.get("spec", {})
        template = spec.get("jobTemplate", {}).get("spec", spec).get("template")
        if template:
            found[resource["metadata"]["name"]] = template["spec"]
    return found


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_every_pod_passes_the_restricted_pod_security_standard_with_a_read_only_root_and_bounded_resources(overlay):
    pods = pod_specs(rendered(overlay))
    assert {"mado-web", "mado-migrate", "mado-beat", "mado-worker-cpu", "mado-worker-maintenance"} <= set(pods)
    for name, pod in pods.items():
        assert violations(pod) == [], name
        for container in containers(pod):
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, name
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][bound]), (name, bound)
        # what the processes write (their data folder, /tmp) is an emptyDir of the pod
        mounts = {mount["mountPath"] for container in containers(pod) for mount in container["volumeMounts"]}
        assert {"/tmp", "/var/lib/mado"} <= mounts, name


def test_the_restricted_checker_refuses_a_privileged_pod_on_the_hosts_paths_and_network():
    pod = copy.deepcopy(pod_specs(rendered("cpu"))["mado-web"])
    pod["hostNetwork"] = True
    pod["volumes"].append({"name": "docker", "hostPath": {"path": "/var/run/docker.sock"}})
    pod["securityContext"].pop("seccompProfile")
    web = pod["containers"][0]
    web["securityContext"] = {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}, "runAsUser": 0}
    web["ports"] = [{"containerPort": 8000, "hostPort": 80}]
    assert violations(pod) == [
        "spec.hostNetwork is set",
        "volume 'docker' is of type hostPath",
        "web: privileged",
        "web: allowPrivilegeEscalation is not false",
        "web: runAsUser is 0",
        "web: seccompProfile.type is not RuntimeDefault or Localhost",
        "web: capabilities.drop lacks ALL",
        "web: capabilities.add holds more than NET_BIND_SERVICE",
        "web: hostPort 80",
    ]


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_every_image_is_one_that_build_image_sh_builds_at_this_release(overlay):
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    built = built_images()
    assert {tag.split(":")[-1] for tag in built} == {version, f"{version}-worker"}
    images = {c["image"] for pod in pod_specs(rendered(overlay)).values() for c in containers(pod)}
    assert images <= built, images - built
    gpu = pod_specs(rendered("gpu"))["mado-worker-gpu"]
    assert gpu["containers"][0]["image"] == f"localhost/mado:{version}-worker"


def test_the_ingress_serves_tls_through_a_named_class():
    ingress = next(r for r in rendered("cpu") if r["kind"] == "Ingress")
    assert ingress["spec"]["ingressClassName"]
    (tls,) = ingress["spec"]["tls"]
    assert tls["secretName"] == "mado-tls"
    assert {rule["host"] for rule in ingress["spec"]["rules"]} <= set(tls["hosts"])


def test_the_monitoring_component_scrapes_web_with_the_metrics_token_and_the_workers_metrics_port(tmp_path):
    """/metrics answers a pod's other addresses only with the token (config/ops.py), so no pod asks to be scraped
    by annotation; the component's PodMonitor sends the token to web's port and reads the workers' own port."""
    kubernetes = os.path.relpath(ROOT / "deploy" / "kubernetes", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [f"{kubernetes}/overlays/gpu"],
                "components": [f"{kubernetes}/components/monitoring"],
            }
        )
    )
    resources = rendered(tmp_path)
    (monitor,) = [r for r in resources if r["kind"] == "PodMonitor"]
    endpoints = {e["port"]: e for e in monitor["spec"]["podMetricsEndpoints"]}
    assert endpoints["http"]["path"] == "/metrics"
    assert endpoints["http"]["authorization"]["credentials"] == {"name": "mado-secrets", "key": "MADO_METRICS_TOKEN"}
    pods = pod_specs(resources)
    ports = {name: {p["name"] for c in pod["containers"] for p in c.get("ports", [])} for name, pod in pods.items()}
    assert "http" in ports["mado-web"]
    assert all("metrics" in ports[name] for name in pods if "worker" in name)
    for resource in resources:
        annotations = resource.get("spec", {}).get("template", {}).get("metadata", {}).get("annotations", {})
        assert not any(key.startswith("prometheus.io/") for key in annotations), resource["metadata"]["name"]
