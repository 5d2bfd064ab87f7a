"""The dispatch outbox: Celery messages that survive a broker outage (docs/design/worker.md#subprocess; docs/deploy.md).

A service that wants work done by a worker calls ``dispatch_create`` inside
its transaction: the ``Dispatch`` row commits with the work (or not at all),
and the message is sent right after the commit. When the broker refuses it,
the row stays unsent and ``dispatch_flush`` (beat) sends it again until the
broker takes it; nothing fails because the broker was down.

Task names are data (``"worker.tasks.run_job"``), so a lower app can ask for
work done by a higher one without importing it (docs/design/house.md#arrows). The
app that owns the work registers two hooks per task name in its ``apps.py``
(``register``): ``waiting(args)`` says whether the work still waits for the
message (a Job still ``queued``), ``give_up(args, reason)`` ends the work
when no worker took it (``dispatch_reap_overdue``: re-sent once, then given up).
"""

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from mado.models import Dispatch

logger = logging.getLogger("mado.outbox")

MAX_SENDS = 2  # the first send and one re-dispatch (then the work is given up)


@dataclass(frozen=True)
class Hooks:
    waiting: Callable[[list], bool]
    give_up: Callable[[list, str], None]


_HOOKS: dict[str, Hooks] = {}


def register(task: str, *, waiting: Callable[[list], bool], give_up: Callable[[list, str], None]) -> None:
    """Say how to tell whether ``task``'s work still waits for its message, and how to end it when none arrives.

    Called from an ``AppConfig.ready``; registering a task name again replaces its hooks.
    """
    _HOOKS[task] = Hooks(waiting=waiting, give_up=give_up)


def dispatch_create(*, task: str, args: list, queue: str, task_id: str) -> Dispatch:
    """Record the message ``task(*args)`` for ``queue`` (task id ``task_id``) and send it once the transaction commits.

    Call inside the transaction that creates the work (``transaction.atomic``):
    if it rolls back, no message exists. ``args`` must be JSON (ids, not
    objects). The send after commit never raises: a broker error leaves the
    row unsent for ``dispatch_flush``. ``task_id`` is unique (IntegrityError
    on reuse).
    """
    row = Dispatch.objects.create(task=task, args=args, queue=queue, task_id=task_id)
    transaction.on_commit(lambda: dispatch_send(dispatch_id=row.pk))
    return row


def _publish(row: Dispatch) -> None:
    if current_app.conf.task_always_eager:  # send_task ignores eager mode; run the registered task here
        importlib.import_module(row.task.rpartition(".")[0])
        current_app.tasks[row.task].apply_async(args=row.args, queue=row.queue, task_id=row.task_id)
    else:
        current_app.send_task(row.task, args=row.args, queue=row.queue, task_id=row.task_id)


def dispatch_send(*, dispatch_id: int) -> bool:
    """Send Dispatch ``dispatch_id`` to the broker now; True when the broker took it.

    Records ``sent_at`` and counts the send; on failure records the error in
    ``last_error`` (logged, never raised: the row waits for the next flush).
    Sending a message twice is harmless: every task's claim is idempotent.
    """
    row = Dispatch.objects.filter(pk=dispatch_id).first()
    if row is None:
        return False
    try:
        _publish(row)
    except Exception as exc:  # noqa: BLE001 - any broker failure: the row stays for the next flush
        logger.warning("could not send %s %s to queue %s: %s", row.task, row.args, row.queue, exc)
        Dispatch.objects.filter(pk=row.pk).update(last_error=f"{type(exc).__name__}: {exc}"[:2000])
        return False
    Dispatch.objects.filter(pk=row.pk).update(sent_at=timezone.now(), sends=F("sends") + 1, last_error="")
    return True


def _waiting(row: Dispatch) -> bool:
    hooks = _HOOKS.get(row.task)
    return hooks is None or hooks.waiting(row.args)


def _done(row: Dispatch) -> None:
    Dispatch.objects.filter(pk=row.pk, done_at__isnull=True).update(done_at=timezone.now())


def dispatch_flush(*, limit: int = 500) -> int:
    """Send the messages the broker has not taken yet, oldest first (at most ``limit``); how many it took.

    A message whose work no longer waits (e.g. a Job aborted while the
    broker was down) is closed unsent. Stops at the first refusal: the
    broker is still down, the rest waits for the next run (beat, every
    ``MADO_REAPER_INTERVAL`` s).
    """
    sent = 0
    for row in Dispatch.objects.filter(sent_at__isnull=True, done_at__isnull=True).order_by("created_at", "id")[:limit]:
        if not _waiting(row):
            _done(row)
        elif dispatch_send(dispatch_id=row.pk):
            sent += 1
        else:
            break
    return sent


def dispatch_reap_overdue(*, now=None) -> int:
    """Handle messages sent more than ``MADO_DISPATCH_TIMEOUT`` s ago whose work no worker took; how many.

    Work that no longer waits closes its row. Otherwise a message sent once
    is sent again (a worker may have lost it: killed between delivery and
    claim, a broker that lost its data); after ``MAX_SENDS`` sends the
    owner's ``give_up`` hook ends the work with a reason naming the queue.
    ``now`` is for tests.
    """
    now = now or timezone.now()
    timeout = settings.MADO_DISPATCH_TIMEOUT
    overdue = Dispatch.objects.filter(done_at__isnull=True, sent_at__lt=now - timedelta(seconds=timeout))
    handled = 0
    for row in overdue.order_by("sent_at", "id"):
        if not _waiting(row):
            _done(row)
            continue
        handled += 1
        if row.sends < MAX_SENDS:
            logger.warning("%s %s: no worker took it within %s s; sending it again", row.task, row.args, timeout)
            dispatch_send(dispatch_id=row.pk)
            continue
        reason = (
            f"No worker took it from queue {row.queue!r} within {timeout} s, sent {row.sends} times; "
            f"check that a worker consumes that queue."
        )
        _HOOKS[row.task].give_up(row.args, reason)
        _done(row)
    return handled
