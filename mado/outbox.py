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

No send waits on the broker longer than ``MADO_BROKER_SEND_TIMEOUT_S`` (``broker_call``): a broker that accepts
connections but never answers leaves the row unsent, as a refused one does, and the request that launched the work
answers at once.
"""

import importlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from mado.models import Dispatch

logger = logging.getLogger("mado.outbox")

MAX_SENDS = 2  # the first send and one re-dispatch (then the work is given up)
T = TypeVar("T")


class BrokerTimeout(TimeoutError):
    """The broker did not answer a call within its deadline (``broker_call``)."""


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


def dispatch_create(*, task: str, args: list, queue: str, task_id: str, delay_s: float = 0) -> Dispatch:
    """Record the message ``task(*args)`` for ``queue`` (task id ``task_id``) and send it once the transaction commits;
    with ``delay_s`` (seconds) its task runs no earlier than that after now (the broker holds it, Celery's countdown).

    Call inside the transaction that creates the work (``transaction.atomic``):
    if it rolls back, no message exists. ``args`` must be JSON (ids, not
    objects). The send after commit never raises: a broker error leaves the
    row unsent for ``dispatch_flush``. ``task_id`` is unique (IntegrityError
    on reuse).
    """
    send_after = timezone.now() + timedelta(seconds=delay_s) if delay_s > 0 else None
    row = Dispatch.objects.create(task=task, args=args, queue=queue, task_id=task_id, send_after=send_after)
    transaction.on_commit(lambda: dispatch_send(dispatch_id=row.pk))
    return row


def broker_call(call: Callable[[], T], *, timeout: float | None = None) -> T:
    """Return ``call()``, a call to the broker (a send, a revoke, a queue's depth), waiting for it at most ``timeout``
    seconds (default ``MADO_BROKER_SEND_TIMEOUT_S``: connecting and sending together); docs/deploy.md, "Messages,
    workers and outages".

    Raises what ``call`` raises, or ``BrokerTimeout`` ("timed out: …") once the deadline passed. The call itself goes
    on until the broker's own socket timeouts end it, and may still reach the broker after the deadline: use it only
    for what may arrive twice (every outbox task's claim is idempotent, a revoke is best effort).
    """
    timeout = settings.MADO_BROKER_SEND_TIMEOUT_S if timeout is None else timeout
    # Why a thread: kombu's and redis-py's timeouts bound each blocking step, never a whole send. On a broker that
    # accepts connections but never answers, one send is the pooled connection's LPUSH (socket_timeout), then
    # kombu's retry on a new connection whose health-check PING redis-py itself retries (its own Retry object, which
    # no transport option reaches): three socket timeouts in a row (docs/deploy.md); a revoke (kombu's pidbox
    # publishes with retry=True and no limit) never ends. Neither Celery nor kombu has a deadline for a publish as a
    # whole (the publish's ``timeout`` reaches only py-amqp's frame write), so the caller waits on an event instead.
    started = time.monotonic()
    outcome: list = []
    answered, abandoned = threading.Event(), threading.Event()

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome.append((False, exc))
        answered.set()
        if abandoned.is_set():
            ok, value = outcome[0]
            late = "it succeeded" if ok else f"it failed: {type(value).__name__}: {value}"
            elapsed = time.monotonic() - started
            logger.info("the broker answered after %.1f s, past its %g s deadline: %s", elapsed, timeout, late)

    threading.Thread(target=run, name="mado-broker-call", daemon=True).start()
    if not answered.wait(timeout):
        abandoned.set()
        raise BrokerTimeout(f"timed out: the broker did not answer within {timeout:g} s")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def _publish(row: Dispatch) -> None:
    delay = {"countdown": max(0.0, (row.send_after - timezone.now()).total_seconds())} if row.send_after else {}
    if current_app.conf.task_always_eager:  # send_task ignores eager mode; run the registered task here
        importlib.import_module(row.task.rpartition(".")[0])
        current_app.tasks[row.task].apply_async(args=row.args, queue=row.queue, task_id=row.task_id)
    else:
        broker_call(
            lambda: current_app.send_task(row.task, args=row.args, queue=row.queue, task_id=row.task_id, **delay)
        )


def dispatch_send(*, dispatch_id: int) -> bool:
    """Send Dispatch ``dispatch_id`` to the broker now; True when the broker took it.

    Records ``sent_at`` and counts the send; on failure records the error in
    ``last_error`` (logged, never raised: the row waits for the next flush).
    Waits at most ``MADO_BROKER_SEND_TIMEOUT_S`` seconds: past it the send
    failed ("BrokerTimeout: timed out: …"), whatever the broker does with it
    later. Sending a message twice is harmless: every task's claim is idempotent.
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
    broker was down) is closed unsent, and so is a sent one whose work a
    worker took (``dispatch_close_taken``). Stops at the first refusal or
    timeout (``MADO_BROKER_SEND_TIMEOUT_S``): the broker is still down, the
    rest waits for the next run (beat, every ``MADO_REAPER_INTERVAL`` s).
    """
    dispatch_close_taken()
    sent = 0
    for row in Dispatch.objects.filter(sent_at__isnull=True, done_at__isnull=True).order_by("created_at", "id")[:limit]:
        if not _waiting(row):
            _done(row)
        elif dispatch_send(dispatch_id=row.pk):
            sent += 1
        else:
            break
    return sent


def dispatch_close_taken() -> int:
    """Close the sent messages whose work no longer waits (a worker claimed the Job, the verification ran); how many.

    Without it a sent message stays open until ``dispatch_reap_overdue`` looks
    at it ``MADO_DISPATCH_TIMEOUT`` s later, and every message of that window
    would count as waiting (``dispatch_backlog``). Called by ``dispatch_flush``.
    """
    closed = 0
    for row in Dispatch.objects.filter(sent_at__isnull=False, done_at__isnull=True).only("pk", "task", "args"):
        if not _waiting(row):
            _done(row)
            closed += 1
    return closed


def dispatch_backlog() -> dict[str, int]:
    """The messages that still wait, for the ``mado_outbox_backlog`` gauge (docs/deploy.md#health-and-metrics):
    ``{"unsent": n, "unclaimed": m}``.

    ``unsent``: open messages the broker has not taken yet (it refused them,
    the send timed out, or it was not tried yet). ``unclaimed``: sent
    messages whose work still waits for a worker (the task's ``waiting``
    hook: a Job still ``queued``), however long ago they were sent; a message
    whose work a worker took, or that was closed, counts in neither.
    """
    open_rows = Dispatch.objects.filter(done_at__isnull=True)
    unsent = open_rows.filter(sent_at__isnull=True).count()
    unclaimed = sum(_waiting(row) for row in open_rows.filter(sent_at__isnull=False).only("pk", "task", "args"))
    return {"unsent": unsent, "unclaimed": unclaimed}


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
