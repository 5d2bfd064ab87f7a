"""Removing the work directories that a worker killed mid-Job left behind (docs/design/worker.md#subprocess;
docs/deploy.md).

A Job's directory (``<MADO_WORKER_WORKDIR>/job-<id>``) is removed by the
worker when the Job ends; a worker that was killed never does. Every
worker therefore sweeps the shared folder when it starts and after each
Job: a ``job-<id>`` directory whose Job has ended (or no longer exists) is
removed. Directories of queued or running Jobs, and anything else in the
folder, are left alone.
"""

import logging
import re
from pathlib import Path

from django.conf import settings

from jobs.models import FINAL_STATES, Job
from worker.extract import remove_tree

logger = logging.getLogger(__name__)

JOB_DIR = re.compile(r"job-(\d+)")


def remove_ended_workdirs(root: Path | None = None) -> int:
    """Remove the ``job-<id>`` directories under ``root`` (default ``MADO_WORKER_WORKDIR``) of ended Jobs; how many.

    Never raises for a directory it cannot remove (logged; tried again next time).
    """
    root = Path(root or settings.MADO_WORKER_WORKDIR)
    try:
        found = {
            int(m.group(1)): path for path in root.iterdir() if (m := JOB_DIR.fullmatch(path.name)) and path.is_dir()
        }
    except FileNotFoundError:
        return 0
    if not found:
        return 0
    alive = set(Job.objects.filter(pk__in=found).exclude(status__in=FINAL_STATES).values_list("pk", flat=True))
    removed = 0
    for job_id, path in found.items():
        if job_id in alive:
            continue
        try:
            remove_tree(path)
        except OSError:
            logger.warning("could not remove %s", path, exc_info=True)
            continue
        logger.info("removed the work directory of ended job %s", job_id)
        removed += 1
    return removed
