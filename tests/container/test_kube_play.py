"""The Kubernetes manifests run (docs/deploy.md#kubernetes): the CPU overlay, rendered by kustomize with a test
kustomization on top (the Secret an operator creates, this machine's PostgreSQL, Redis and moto S3, a free port),
is played by ``podman kube play`` on the host network after the migration; the web, CPU worker, maintenance
worker and beat pods run, and the web pod's ``/readyz`` answers 200."""

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import requests
import yaml

from tests.container.test_image import LIMITS, PODMAN, container_log, images, podman  # noqa: F401 - fixture
from tests.deployment import free_port
from tests.integration.conftest import moto_endpoint, postgres_url, redis_url  # noqa: F401 - fixtures
from tests.integration.test_faults_outages import bucket, s3_variables  # noqa: F401 - fixture

pytestmark = pytest.mark.container
ROOT = Path(__file__).resolve().parents[2]
PLAYED = {"Deployment", "ConfigMap"}  # what Podman plays; Service, Ingress, PDB are the cluster's


def test_the_cpu_overlay_plays_under_podman_and_reaches_readyz(
    images,
    tmp_path,
    postgres_url,
    redis_url,
    moto_endpoint,
    bucket,  # noqa: F811
):
    port, suffix = free_port(), uuid.uuid4().hex[:8]
    shutil.copytree(ROOT / "deploy" / "kubernetes", tmp_path / "kubernetes")
    secrets = {
        **s3_variables(moto_endpoint, bucket[1]),
        "MADO_DATABASE_URL": postgres_url,
        "CELERY_BROKER_URL": redis_url,
        "MADO_SECRET_KEY": "kube-play-test-secret",
    }
    settings = {
        "MADO_BIND": f"127.0.0.1:{port}",
        "MADO_ALLOWED_HOSTS": "127.0.0.1",
        "MADO_PUBLIC_URL": f"http://127.0.0.1:{port}",
        "MADO_METRICS_PORT": "0",  # the two workers share the host's network
        "MADO_CHECKPOINT_VERIFY_QUEUE": f"maintenance-{suffix}",
        "MADO_MAINTENANCE_QUEUE": f"maintenance-{suffix}",
        "MADO_WEB_WORKERS": "1",
    }
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["../kubernetes/overlays/cpu"],
                "configMapGenerator": [
                    {"name": "mado-config", "behavior": "merge", "literals": [f"{k}={v}" for k, v in settings.items()]}
                ],
                "secretGenerator": [
                    {
                        "name": "mado-secrets",
                        "literals": [f"{k}={v}" for k, v in secrets.items()],
                        "options": {"disableNameSuffixHash": True},
                    }
                ],
                "nameSuffix": f"-{suffix}",
            }
        )
    )
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(tmp_path / "test")], check=True, capture_output=True, text=True
    ).stdout
    everything = [doc for doc in yaml.safe_load_all(rendered) if doc]
    docs = [doc for doc in everything if doc["kind"] in PLAYED]
    # Podman reads a pod's Secret from its own store, kept there as the JSON of its data (the operator's
    # `kubectl create secret` on a cluster).
    secret = next(doc for doc in everything if doc["kind"] == "Secret")
    secret_name = f"mado-secrets-{suffix}"
    secret["metadata"]["name"] = secret_name
    (tmp_path / "secret.json").write_text(json.dumps(secret["data"]))
    for doc in docs:
        # On the host's network the pods share ports: web serves on the test's port and the probes (whose ports
        # name the cluster's) are left to the test, which asks /readyz itself.
        for container in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            for key in ("ports", "startupProbe", "livenessProbe", "readinessProbe"):
                container.pop(key, None)
            for source in container.get("envFrom", []):
                if "secretRef" in source:
                    source["secretRef"]["name"] = secret_name
    played = tmp_path / "played.yaml"
    played.write_text(yaml.safe_dump_all(docs))
    conf = tmp_path / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n')
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    migrate_env = [arg for key, value in {**secrets, **settings}.items() for arg in ("--env", f"{key}={value}")]
    podman("run", "--rm", "--network", "host", *LIMITS, *migrate_env, images[0], "migrate")
    podman("secret", "create", secret_name, str(tmp_path / "secret.json"))
    try:
        started = subprocess.run(
            [*PODMAN, "kube", "play", "--network", "host", str(played)], capture_output=True, text=True, env=env
        )
        assert started.returncode == 0, started.stdout + started.stderr
        deadline, answer = time.monotonic() + 120, None
        while time.monotonic() < deadline:
            try:
                answer = requests.get(f"http://127.0.0.1:{port}/readyz", timeout=10)
                if answer.status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(1)
        assert answer is not None and answer.status_code == 200, (answer and answer.text, pod_logs(suffix))
        running = podman("ps", "--filter", f"name={suffix}", "--filter", "status=running", "--format", "{{.Names}}")
        running = set(running.stdout.split())
        states = podman("ps", "--all", "--filter", f"name={suffix}", "--format", "{{.Names}} {{.Status}}").stdout
        for role in ("web", "worker-cpu", "worker-maintenance", "beat"):
            assert any(f"mado-{role}-{suffix}" in name for name in running), (states, pod_logs(suffix))
    finally:
        subprocess.run([*PODMAN, "kube", "down", str(played)], capture_output=True, env=env)
        podman("secret", "rm", secret_name, check=False)


def pod_logs(suffix: str) -> str:
    names = podman("ps", "--all", "--filter", f"name={suffix}", "--format", "{{.Names}}").stdout.split()
    return "\n".join(f"--- {name} ---\n{container_log(name)[-3000:]}" for name in names)
