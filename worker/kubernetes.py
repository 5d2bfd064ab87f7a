"""The Kubernetes runner: a multi-node Job as a JobSet manifest plus a Secret (docs/design/worker.md;
docs/design/resume.md#in-the-code).

Why a JobSet (``jobset.x-k8s.io/v1alpha2``) and not a PyTorchJob or a
TrainJob: the Training Operator's ``PyTorchJob`` (``kubeflow.org/v1``) is
the v1 API that Kubeflow Trainer v2 replaced; a Kubeflow Trainer v2
``TrainJob`` is what a Kubeflow user writes today, but the Trainer turns it
into a JobSet, its way of changing a Runtime's pod template is itself
changing between releases (``podTemplateOverrides`` → ``runtimePatches``)
and it cannot add our init container without a cluster-specific
``TrainingRuntime``. A JobSet is that same layer with plain Kubernetes pod
templates: it runs on every cluster that has Kubeflow Trainer (which installs
the JobSet controller) or only the JobSet controller, and every pod field
here is checked against the official client's models.

What the manifest holds (docs/deploy.md):

- a ``Secret`` ``<name>-token`` with the Run's token (``MMT_API_TOKEN``,
  ``jobs.services.run_token_issue``); the pods read it through
  ``secretKeyRef``, so the token never appears in the pod spec;
- a JobSet ``<name>`` with one replicated Job ``node``: ``nnodes`` pods
  (an Indexed Job, no automatic restart: docs/design/resume.md#retry), each running the entrypoint
  under torchrun as the worker does (``worker.distributed.torchrun_argv``:
  ``python -m torch.distributed.run --nnodes N --master-addr <node 0>
  --nproc-per-node P train.py …``) in the Job's image, with
  ``PET_NODE_RANK`` = the pod's completion index;
- the code's variables exactly as the Celery worker's container runner
  builds them (``worker.execute.code_variables`` then
  ``worker.container.container_env``): ``MMT_*``, with
  ``MMT_RESUME_CHECKPOINT_DIR`` = ``/mmt/inputs/checkpoint``;
- for a resume or continue, an init container that runs
  ``mado checkpoint restore <id> --into /mmt/inputs`` (the SDK's one-pass
  download + ``CheckpointVerifier`` + extraction, the reader the worker
  uses) into an ``emptyDir`` the training container mounts read-only: a
  tampered checkpoint fails the init container and the code never starts
  (docs/design/worker.md#refusal).

``submit`` creates both objects with the client; it needs a cluster and is
not exercised by the tests.
"""

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kubernetes import client as k8s

from jobs import services as jobs_services
from jobs.models import Job
from worker import container, distributed
from worker.execute import RESUMING_KINDS, Prepared, code_variables

JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
REPLICATED_JOB = "node"
TOKEN_VARIABLE = "MMT_API_TOKEN"
INPUTS_DIR = str(PurePosixPath(container.CONTAINER_CHECKPOINT_DIR).parent)  # /mmt/inputs
MASTER_PORT = 29500
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
NAME_MAX = 40  # pods are named <name>-node-<job>-<pod>: their host names must stay within 63 characters
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE_INVALID = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class ManifestOptions:
    """Choices for ``build_manifest``; None takes the Job's own value.

    ``name`` (DNS-1123 label, at most ``NAME_MAX`` characters; default
    ``mado-job-<id>``), ``namespace`` (DNS-1123 label), ``image`` (default:
    the Job's Queue's container image), ``init_image`` (default ``image``:
    it must have the ``mado`` command, i.e. ``mado-tracking`` installed),
    ``nnodes`` / ``nproc_per_node`` (>= 1; default the Job's),
    ``gpus_per_node`` (``nvidia.com/gpu`` per pod, >= 0; default
    ``nproc_per_node``), ``service_account`` (empty: the namespace's default).
    """

    name: str | None = None
    namespace: str = "default"
    image: str | None = None
    init_image: str | None = None
    nnodes: int | None = None
    nproc_per_node: int | None = None
    gpus_per_node: int | None = None
    service_account: str = ""


def dns1123_label(value: str, *, field: str, max_length: int = 63) -> str:
    """``value`` when it is a DNS-1123 label of at most ``max_length`` characters; else ``ValueError`` naming
    ``field`` and the rule (lower-case letters, digits and '-', starting and ending alphanumeric)."""
    if not isinstance(value, str) or not value or len(value) > max_length or not _LABEL.fullmatch(value):
        raise ValueError(
            f"{field}: {value!r} is not a valid name: use at most {max_length} lower-case letters, "
            "digits and '-', starting and ending with a letter or digit"
        )
    return value


def dns1123_subdomain(value: str, *, field: str) -> str:
    """``value`` when it is a DNS-1123 subdomain (dot-separated labels, at most 253 characters, e.g. a service
    account's name); else ``ValueError`` naming ``field``."""
    if not isinstance(value, str) or len(value) > 253:
        raise ValueError(f"{field}: {value!r} is not a valid name: at most 253 characters")
    for part in value.split("."):
        dns1123_label(part, field=field)
    return value


def _image(value: str, *, field: str) -> str:
    """An image reference as given (``registry/name:tag``): no blank, space or control character, no leading '-'."""
    if not value or value.startswith("-") or any(ch.isspace() or not ch.isprintable() for ch in value):
        raise ValueError(f"{field}: {value!r} is not an image reference such as registry.example.com/team/train:1")
    return value


def label_value(text: str) -> str:
    """``text`` as a Kubernetes label value: other characters become '-', at most 63 characters (a longer one
    keeps a hash of the whole so two long names stay apart), starting and ending alphanumeric; may be ''."""
    value = _LABEL_VALUE_INVALID.sub("-", str(text))
    if len(value) > 63:
        value = value[:54] + "-" + hashlib.sha256(str(text).encode()).hexdigest()[:8]
    return value.strip("-_.")


def _positive(value: int, *, field: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{field}: must be an integer >= {minimum}, got {value!r}")
    return value


def build_manifest(job: Job, options: ManifestOptions = ManifestOptions()) -> list[dict]:
    """``[Secret, JobSet]`` as plain dicts (``yaml.safe_dump_all`` prints them) for not-yet-ended ``job``.

    Issues (or reuses) the Run's token through ``run_token_issue``. Raises
    ``ValueError`` naming the option for a bad name, namespace, count or a
    missing image; ``mado.errors.Conflict`` for a Job that already ended.
    """
    name = dns1123_label(
        f"mado-job-{job.pk}" if options.name is None else options.name, field="name", max_length=NAME_MAX
    )
    namespace = dns1123_label(options.namespace, field="namespace")
    nnodes = _positive(options.nnodes if options.nnodes is not None else job.nnodes, field="nnodes")
    nproc = _positive(
        options.nproc_per_node if options.nproc_per_node is not None else job.nproc_per_node, field="nproc_per_node"
    )
    gpus = _positive(
        nproc if options.gpus_per_node is None else options.gpus_per_node, field="gpus_per_node", minimum=0
    )
    image = options.image if options.image is not None else job.queue.image
    if not image:
        raise ValueError(f"image: queue {job.queue.name!r} has no container image; give the image to run")
    image = _image(image, field="image")
    init_image = image if options.init_image is None else _image(options.init_image, field="init_image")
    service_account = (
        dns1123_subdomain(options.service_account, field="service_account") if options.service_account else None
    )
    checkpoint = _source_checkpoint(job)
    token = jobs_services.run_token_issue(job=job).key
    prepared = Prepared(
        code_dir=Path(container.CONTAINER_CODE_DIR),
        checkpoint_dir=Path(container.CONTAINER_CHECKPOINT_DIR) if checkpoint else None,
        resume_file=Path(container.CONTAINER_RESUME_FILE) if checkpoint else None,
        step=checkpoint.step if checkpoint else None,
    )
    variables = container.container_env(code_variables(job, prepared, token))
    labels = {
        "app.kubernetes.io/managed-by": "mado",
        "mado/job-id": str(job.pk),
        "mado/project": label_value(job.run.project.slug),
        "mado/queue": label_value(job.queue.name),
    }
    secret = k8s.V1Secret(
        api_version="v1",
        kind="Secret",
        type="Opaque",
        string_data={TOKEN_VARIABLE: token},
        metadata=k8s.V1ObjectMeta(name=f"{name}-token", namespace=namespace, labels=labels),
    )
    pod = _pod_spec(
        job,
        name=name,
        image=image,
        variables=variables,
        nnodes=nnodes,
        nproc=nproc,
        gpus=gpus,
        checkpoint_id=checkpoint.pk if checkpoint else None,
        init_image=init_image,
        service_account=service_account,
    )
    template = k8s.V1JobTemplateSpec(
        spec=k8s.V1JobSpec(
            parallelism=nnodes,
            completions=nnodes,
            completion_mode="Indexed",
            backoff_limit=0,
            template=k8s.V1PodTemplateSpec(metadata=k8s.V1ObjectMeta(labels=labels), spec=pod),
        )
    )
    jobset = {
        "apiVersion": f"{JOBSET_GROUP}/{JOBSET_VERSION}",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            # docs/design/resume.md#retry: a failed attempt is resumed by hand, from a checkpoint
            "failurePolicy": {"maxRestarts": 0},
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": 1, "template": template}],
        },
    }
    return [_plain(secret), _plain(jobset)]


def _source_checkpoint(job: Job):
    if job.kind not in RESUMING_KINDS:
        return None
    checkpoint = job.run.source_checkpoint
    if checkpoint is None:
        raise ValueError(f"job: Job {job.pk} is a {job.kind} but its Run records no source checkpoint")
    return checkpoint


def _pod_spec(
    job: Job,
    *,
    name: str,
    image: str,
    variables: dict[str, str],
    nnodes: int,
    nproc: int,
    gpus: int,
    checkpoint_id: int | None,
    init_image: str,
    service_account: str | None,
) -> k8s.V1PodSpec:
    token = k8s.V1EnvVar(
        name=TOKEN_VARIABLE,
        value_from=k8s.V1EnvVarSource(secret_key_ref=k8s.V1SecretKeySelector(name=f"{name}-token", key=TOKEN_VARIABLE)),
    )
    env = [k8s.V1EnvVar(name=key, value=value) for key, value in sorted(variables.items()) if key != TOKEN_VARIABLE]
    env += [
        token,
        k8s.V1EnvVar(name="PYTHONUNBUFFERED", value="1"),
        k8s.V1EnvVar(
            name="PET_NODE_RANK",
            value_from=k8s.V1EnvVarSource(field_ref=k8s.V1ObjectFieldSelector(field_path=COMPLETION_INDEX)),
        ),
    ]
    safe = k8s.V1SecurityContext(allow_privilege_escalation=False)
    mounts = [k8s.V1VolumeMount(name="dshm", mount_path="/dev/shm")]  # NCCL and DataLoader workers need room
    volumes = [k8s.V1Volume(name="dshm", empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory"))]
    init_containers = None
    if checkpoint_id is not None:
        volumes.append(k8s.V1Volume(name="mado-inputs", empty_dir=k8s.V1EmptyDirVolumeSource()))
        mounts.append(k8s.V1VolumeMount(name="mado-inputs", mount_path=INPUTS_DIR, read_only=True))
        init_containers = [
            k8s.V1Container(
                name="restore-checkpoint",
                image=init_image,
                security_context=safe,
                command=["mado", "checkpoint", "restore", str(checkpoint_id), "--into", INPUTS_DIR, "--clean"],
                env=[k8s.V1EnvVar(name="MMT_API_URL", value=variables["MMT_API_URL"]), token],
                volume_mounts=[k8s.V1VolumeMount(name="mado-inputs", mount_path=INPUTS_DIR)],
            )
        ]
    rendezvous = (
        ["--standalone"]
        if nnodes == 1
        else [f"--nnodes={nnodes}", f"--master-addr={name}-{REPLICATED_JOB}-0-0.{name}", f"--master-port={MASTER_PORT}"]
    )
    node = k8s.V1Container(
        name=REPLICATED_JOB,
        image=image,
        security_context=safe,
        env=env,
        volume_mounts=mounts,
        command=distributed.torchrun_argv(list(job.code_version.entrypoint), nproc, rendezvous=rendezvous),
        ports=[k8s.V1ContainerPort(container_port=MASTER_PORT, name="rendezvous")] if nnodes > 1 else None,
        resources=k8s.V1ResourceRequirements(limits={"nvidia.com/gpu": str(gpus)}) if gpus else None,
    )
    return k8s.V1PodSpec(
        restart_policy="Never",
        init_containers=init_containers,
        containers=[node],
        volumes=volumes,
        service_account_name=service_account,
    )


def _plain(obj) -> dict:
    """The client's models (anywhere inside ``obj``) as the JSON-ready dicts the API server takes."""
    return k8s.ApiClient().sanitize_for_serialization(obj)


def submit(documents: list[dict]) -> None:
    """Create ``build_manifest``'s Secret and JobSet in their namespace (kubeconfig, else in-cluster config).

    Needs a reachable cluster with the JobSet controller; raises the
    client's ``ApiException`` (e.g. 409 when the objects already exist:
    the Job was submitted before) and ``ConfigException`` without
    credentials.
    """
    from kubernetes import config

    config.load_config()
    secret, jobset = documents
    namespace = jobset["metadata"]["namespace"]
    k8s.CoreV1Api().create_namespaced_secret(namespace, secret)
    k8s.CustomObjectsApi().create_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, namespace, "jobsets", jobset)
