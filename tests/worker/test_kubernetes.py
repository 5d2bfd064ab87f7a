"""The Kubernetes runner's manifest: a Secret and a JobSet the official client's models accept, the Run's token
only in the Secret, the code's variables as the worker sets them, names Kubernetes takes
(docs/design/worker.md#distributed, #extract)."""

import re

import pytest
import yaml
from django.core.management import CommandError, call_command
from kubernetes.client import ApiClient

from jobs.models import Job
from jobs.services import job_abort, run_resume_from_checkpoint, run_token_issue
from tests.worker.helpers import stored_checkpoint
from worker import container
from worker.execute import Prepared, code_variables
from worker.kubernetes import ManifestOptions, build_manifest, dns1123_label, label_value

OPTIONS = ManifestOptions(image="registry.example.com/team/train:1", nnodes=3, nproc_per_node=4)
LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def through_model(data: dict, model: str) -> dict:
    """``data`` read into the client's ``model`` and written back: a field the model does not know is lost, a
    required one missing raises, so equality means the object is what the API server takes."""
    api = ApiClient()
    return api.sanitize_for_serialization(api._ApiClient__deserialize(data, model))


def pod_of(jobset: dict) -> dict:
    (replicated,) = jobset["spec"]["replicatedJobs"]
    return replicated["template"]["spec"]["template"]["spec"]


def env_of(container_spec: dict) -> dict:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container_spec["env"]}


@pytest.fixture
def resumed(failed_source_job, creator):
    checkpoint = stored_checkpoint(failed_source_job.run, 20)
    return run_resume_from_checkpoint(actor=creator, checkpoint=checkpoint), checkpoint


def test_the_manifest_is_a_secret_and_a_jobset_whose_pods_the_client_models_accept(resumed):
    job, _ = resumed
    secret, jobset = build_manifest(job, OPTIONS)
    assert through_model(secret, "V1Secret") == secret
    assert (secret["apiVersion"], secret["kind"], secret["type"]) == ("v1", "Secret", "Opaque")
    assert (jobset["apiVersion"], jobset["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    (replicated,) = jobset["spec"]["replicatedJobs"]
    assert through_model(replicated["template"], "V1JobTemplateSpec") == replicated["template"]
    spec = replicated["template"]["spec"]
    assert (spec["parallelism"], spec["completions"], spec["completionMode"]) == (3, 3, "Indexed")
    assert spec["backoffLimit"] == 0
    assert jobset["spec"]["failurePolicy"] == {"maxRestarts": 0}, "a failed attempt is resumed by hand"
    pod = pod_of(jobset)
    (node,) = pod["containers"]
    assert pod["restartPolicy"] == "Never" and node["image"] == OPTIONS.image
    python, script, *rest = job.code_version.entrypoint  # [python, train.py, …]: torchrun with that interpreter
    assert node["command"] == [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes=3",
        f"--master-addr=mado-job-{job.pk}-node-0-0.mado-job-{job.pk}",
        "--master-port=29500",
        "--nproc-per-node",
        "4",
        script,
        *rest,
    ]
    assert node["resources"] == {"limits": {"nvidia.com/gpu": "4"}}
    assert env_of(node)["PET_NODE_RANK"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
    }
    assert len(f"{jobset['metadata']['name']}-node-0-0") <= 63, "a pod's host name must be a DNS label"


def test_the_runs_token_is_in_the_secret_and_nowhere_in_the_pods(resumed):
    job, _ = resumed
    secret, jobset = build_manifest(job, OPTIONS)
    token = run_token_issue(job=job).key
    assert secret["stringData"] == {"MMT_API_TOKEN": token}
    assert token not in yaml.safe_dump(jobset)
    reference = {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "MMT_API_TOKEN"}}
    pod = pod_of(jobset)
    assert env_of(pod["containers"][0])["MMT_API_TOKEN"] == reference
    assert env_of(pod["initContainers"][0])["MMT_API_TOKEN"] == reference
    assert build_manifest(job, OPTIONS)[0] == secret, "building it again reuses the Run's one token"


def test_the_code_gets_the_variables_the_worker_gives_a_container_and_the_restored_checkpoint(resumed):
    job, checkpoint = resumed
    _, jobset = build_manifest(job, OPTIONS)
    pod = pod_of(jobset)
    expected = container.container_env(
        code_variables(
            job,
            Prepared(
                code_dir=None,
                checkpoint_dir=container.CONTAINER_CHECKPOINT_DIR,
                resume_file=container.CONTAINER_RESUME_FILE,
                step=20,
            ),
            "token",
        )
    )
    env = env_of(pod["containers"][0])
    assert {name: env[name] for name in expected if name != "MMT_API_TOKEN"} == {
        name: value for name, value in expected.items() if name != "MMT_API_TOKEN"
    }
    assert env["MMT_RESUME_CHECKPOINT_DIR"] == "/mmt/inputs/checkpoint" and env["MMT_RESUME_STEP"] == "20"
    assert env["MMT_RUN_ID"] == job.run.external_id and env["MMT_START_KIND"] == "resume"
    (init,) = pod["initContainers"]
    assert init["command"] == ["mado", "checkpoint", "restore", str(checkpoint.pk), "--into", "/mmt/inputs", "--clean"]
    assert {m["mountPath"]: m.get("readOnly", False) for m in init["volumeMounts"]} == {"/mmt/inputs": False}
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["/mmt/inputs"] is True, "the training code cannot change the verified checkpoint"
    assert {v["name"]: v for v in pod["volumes"]}["mado-inputs"] == {"name": "mado-inputs", "emptyDir": {}}


def test_a_new_job_on_one_node_has_no_restore_step_and_uses_a_standalone_rendezvous(launch):
    job = launch()
    _, jobset = build_manifest(job, ManifestOptions(image="train:1", nnodes=1, nproc_per_node=2, gpus_per_node=0))
    pod = pod_of(jobset)
    assert "initContainers" not in pod and "resources" not in pod["containers"][0]
    assert pod["containers"][0]["command"][1:6] == [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
    ]
    assert "MMT_RESUME_CHECKPOINT_DIR" not in env_of(pod["containers"][0])


@pytest.mark.parametrize(
    "name", ["Mado-Job", "mado_job", "job.1", "-job", "job-", "ジョブ", "a" * 41, "a b", "", "x\nmetadata: {}"]
)
def test_a_name_kubernetes_would_refuse_is_refused_naming_the_option(launch, name):
    with pytest.raises(ValueError, match=r"^name: .* is not a valid name"):
        build_manifest(launch(), ManifestOptions(name=name, image="train:1", nnodes=2, nproc_per_node=1))


@pytest.mark.parametrize("namespace", ["Kube-System", "a" * 64, "ns/other", "..", "default\n"])
def test_a_bad_namespace_is_refused(launch, namespace):
    with pytest.raises(ValueError, match=r"^namespace: "):
        build_manifest(launch(), ManifestOptions(namespace=namespace, image="train:1", nnodes=2, nproc_per_node=1))


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("image", "train:1\nkind: Pod", "is not an image reference"),
        ("image", "-it", "is not an image reference"),
        ("image", "train 1", "is not an image reference"),
        ("init_image", "", "is not an image reference"),
        ("service_account", "Admin", "is not a valid name"),
        ("service_account", "a..b", "is not a valid name"),
        ("service_account", "x" * 254, "at most 253"),
    ],
)
def test_bad_images_and_service_accounts_are_refused_naming_the_option(launch, field, value, message):
    options = {"image": "train:1", "nnodes": 2, "nproc_per_node": 1, field: value}
    with pytest.raises(ValueError, match=rf"^{field}: .*{message}"):
        build_manifest(launch(), ManifestOptions(**options))


def test_a_service_account_with_dots_is_taken(launch):
    _, jobset = build_manifest(
        launch(), ManifestOptions(image="train:1", nnodes=2, nproc_per_node=1, service_account="trainer.team-a")
    )
    assert pod_of(jobset)["serviceAccountName"] == "trainer.team-a"


@pytest.mark.parametrize(
    "field, value",
    [("nnodes", 0), ("nproc_per_node", -1), ("nnodes", True), ("gpus_per_node", -2), ("nproc_per_node", 2.5)],
)
def test_bad_counts_are_refused_naming_the_field(launch, field, value):
    options = {"image": "train:1", "nnodes": 2, "nproc_per_node": 1, field: value}
    with pytest.raises(ValueError, match=rf"^{field}: must be an integer"):
        build_manifest(launch(), ManifestOptions(**options))


def test_a_queue_without_an_image_needs_one(launch):
    with pytest.raises(ValueError, match=r"^image: queue 'cpu' has no container image"):
        build_manifest(launch(), ManifestOptions(nnodes=2, nproc_per_node=1))


@pytest.mark.parametrize("text", ["GPU_A100", "_leading", "trailing.", "x" * 100, "ジョブ-queue", "a/b c", "-" * 70])
def test_queue_and_project_names_become_valid_label_values(text):
    value = label_value(text)
    assert LABEL_VALUE.fullmatch(value) and len(value) <= 63, value


def test_two_long_names_that_differ_only_at_the_end_keep_different_labels():
    assert label_value("q" * 80 + "1") != label_value("q" * 80 + "2")


def test_labels_of_a_hostile_queue_name_are_valid(launch, queue):
    queue.name = "GPU_Pool_" + "x" * 90
    queue.save()
    secret, jobset = build_manifest(launch(), ManifestOptions(image="train:1", nnodes=2, nproc_per_node=1))
    for labels in (secret["metadata"]["labels"], jobset["metadata"]["labels"]):
        assert all(LABEL_VALUE.fullmatch(value) and len(value) <= 63 for value in labels.values()), labels
    assert dns1123_label(jobset["metadata"]["name"], field="name")


def test_the_command_prints_the_two_documents(resumed, capsys):
    job, _ = resumed
    call_command(
        "job_manifest",
        str(job.pk),
        "--image",
        "train:1",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "8",
        "--namespace",
        "training",
    )
    secret, jobset = yaml.safe_load_all(capsys.readouterr().out)
    assert secret["kind"] == "Secret" and jobset["kind"] == "JobSet"
    assert jobset["metadata"]["namespace"] == secret["metadata"]["namespace"] == "training"
    command = pod_of(jobset)["containers"][0]["command"]
    assert "--nnodes=2" in command and command[command.index("--nproc-per-node") + 1] == "8"


@pytest.mark.parametrize("job_id", ["1; rm -rf /", "-1", "１２", "0x1", "", "1e3", "9" * 30])
def test_the_command_refuses_what_is_not_a_job_id(db, job_id):
    with pytest.raises(CommandError, match=r"^job: .* is not a Job id"):
        call_command("job_manifest", job_id)


def test_the_command_names_a_missing_job_an_ended_one_and_a_bad_count(launch, creator):
    with pytest.raises(CommandError, match=r"^job: there is no Job 999999$"):
        call_command("job_manifest", "999999")
    job = launch()
    with pytest.raises(CommandError, match=r"whole number"):
        call_command("job_manifest", str(job.pk), "--image", "train:1", "--nnodes", "٣")
    job_abort(actor=creator, job=job)
    with pytest.raises(CommandError, match=rf"job {job.pk} already ended aborted: no token is issued"):
        call_command("job_manifest", str(job.pk), "--image", "train:1", "--nnodes", "2", "--nproc-per-node", "1")


def test_nodes_and_processes_default_to_the_jobs_own(launch):
    job = launch()
    Job.objects.filter(pk=job.pk).update(nnodes=4, nproc_per_node=8)
    job.refresh_from_db()
    _, jobset = build_manifest(job, ManifestOptions(image="train:1"))
    spec = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert (spec["parallelism"], spec["completions"]) == (4, 4)
    node = spec["template"]["spec"]["containers"][0]
    assert "--nnodes=4" in node["command"] and node["command"][node["command"].index("--nproc-per-node") + 1] == "8"
    assert node["resources"] == {"limits": {"nvidia.com/gpu": "8"}}
