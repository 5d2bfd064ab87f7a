"""``python manage.py job_manifest JOB``: print a Job as Kubernetes YAML, or create it
(docs/design/worker.md#distributed; docs/deploy.md).

Prints two documents, the Secret holding the Run's token and the JobSet
(``worker.kubernetes``), for ``kubectl apply -f -``; ``--submit`` creates
them with the cluster credentials of this machine instead. Needs the
``k8s`` extra (``pip install 'mado[k8s]'``).
"""

import argparse
import re

import yaml
from django.core.management.base import BaseCommand, CommandError

from jobs.models import Job
from mado.errors import UserError

_JOB_ID = re.compile(r"^[0-9]{1,18}$")


def _count(text: str) -> int:
    """A count given on the command line: ASCII digits only (``int`` would take '٣' or ' 3 ')."""
    if not re.fullmatch(r"[0-9]{1,6}", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number such as 2")
    return int(text)


class Command(BaseCommand):
    help = (
        "Print the Kubernetes objects (a Secret with the Run's token and a JobSet running torchrun on every "
        "node) that run JOB on a cluster, or create them with --submit."
    )

    def add_arguments(self, parser):
        parser.add_argument("job", help="the Job's id")
        parser.add_argument("--name", default=None, help="the JobSet's name (default mado-job-<id>)")
        parser.add_argument("--namespace", default="default", help="Kubernetes namespace (default: default)")
        parser.add_argument("--image", default=None, help="image to run the code in (default: the queue's image)")
        parser.add_argument(
            "--init-image",
            default=None,
            help="image of the checkpoint restore step; needs the mado command (default: --image)",
        )
        parser.add_argument("--nnodes", type=_count, default=None, help="number of nodes (default: the Job's)")
        parser.add_argument(
            "--nproc-per-node", type=_count, default=None, help="processes per node (default: the Job's)"
        )
        parser.add_argument(
            "--gpus-per-node",
            type=_count,
            default=None,
            help="GPUs each node requests (default: processes per node; 0: none)",
        )
        parser.add_argument("--service-account", default="", help="service account of the pods")
        parser.add_argument("--submit", action="store_true", help="create the objects in the cluster")

    def handle(self, *args, **options):
        try:
            from worker import kubernetes
        except ImportError as exc:
            raise CommandError(f"the Kubernetes client is not installed ({exc}): pip install 'mado[k8s]'") from None
        job_id = options["job"].strip()
        if not _JOB_ID.match(job_id):
            raise CommandError(f"job: {options['job']!r} is not a Job id (a number such as 42)")
        job = (
            Job.objects.select_related("run__project", "run__source_checkpoint", "queue", "code_version")
            .filter(pk=int(job_id))
            .first()
        )
        if job is None:
            raise CommandError(f"job: there is no Job {job_id}")
        choices = kubernetes.ManifestOptions(
            name=options["name"],
            namespace=options["namespace"],
            image=options["image"],
            init_image=options["init_image"],
            nnodes=options["nnodes"],
            nproc_per_node=options["nproc_per_node"],
            gpus_per_node=options["gpus_per_node"],
            service_account=options["service_account"],
        )
        try:
            documents = kubernetes.build_manifest(job, choices)
        except (ValueError, UserError) as exc:
            raise CommandError(str(exc)) from None
        if options["submit"]:
            kubernetes.submit(documents)
            self.stdout.write(
                f"created Secret {documents[0]['metadata']['name']} and JobSet "
                f"{documents[1]['metadata']['name']} in namespace {options['namespace']}"
            )
            return
        self.stdout.write(yaml.safe_dump_all(documents, sort_keys=False), ending="")
