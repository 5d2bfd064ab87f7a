"""State changes of Jobs (docs/design/house.md#where-logic-goes; docs/jobs.md is the contract with ``worker/``).

``launch``: ``job_launch`` and the automatic ``job_retry_from_scratch`` (docs/design/resume.md#retry);
``resume``: ``run_resume_from_checkpoint`` and ``job_resume_from_latest`` (docs/design/resume.md);
``continue_``: ``run_continue_from_checkpoint`` (docs/design/resume.md#continue, #continue-lineage);
``lifecycle``: what the worker and beat call while a Job runs — ``job_claim``,
``job_heartbeat``, ``job_append_log``, ``job_finish``, ``job_abort``,
``job_reap_stale``, ``run_token_issue`` (docs/design/worker.md#subprocess).

Every function takes keyword-only arguments and raises ``mado.errors`` user
errors: ``ValidationFailed`` (400, naming the field), ``Forbidden`` (403),
``NotFound`` (404), ``Conflict`` (409). A status change is a conditional
UPDATE on the expected old status; Celery is only reached on commit.
"""

from jobs.services.continue_ import run_continue_from_checkpoint
from jobs.services.launch import job_launch, job_retry_from_scratch
from jobs.services.lifecycle import (
    job_abort,
    job_append_log,
    job_claim,
    job_finish,
    job_heartbeat,
    job_reap_stale,
    run_token_issue,
)
from jobs.services.resume import job_resume_from_latest, run_resume_from_checkpoint

__all__ = [
    "job_abort",
    "job_append_log",
    "job_claim",
    "job_finish",
    "job_heartbeat",
    "job_launch",
    "job_reap_stale",
    "job_resume_from_latest",
    "job_retry_from_scratch",
    "run_continue_from_checkpoint",
    "run_resume_from_checkpoint",
    "run_token_issue",
]
