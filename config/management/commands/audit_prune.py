"""``manage.py audit_prune [--days N]``: delete audit records older than N days (default
``MADO_AUDIT_RETENTION_DAYS``; 0 keeps every record), the only way records leave the audit log (docs/api.md#audit)."""

from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction
from django.utils import timezone

from mado.models import AuditEvent


class Command(BaseCommand):
    help = "Delete audit records older than --days (default: MADO_AUDIT_RETENTION_DAYS; 0 keeps them all)."

    def add_arguments(self, parser):
        parser.add_argument("--days", type=int, default=None)

    def handle(self, *args, days: int | None, **options):
        days = settings.MADO_AUDIT_RETENTION_DAYS if days is None else days
        if days < 0:
            raise CommandError("--days must be 0 (keep everything) or more")
        if days == 0:
            self.stdout.write("retention is 0 days: every audit record is kept")
            return
        cutoff = timezone.now() - timedelta(days=days)
        table = connection.ops.quote_name(AuditEvent._meta.db_table)
        with transaction.atomic(), connection.cursor() as cursor:
            # PostgreSQL's guard lets this transaction alone delete (docs/api.md#audit).
            postgres = connection.vendor == "postgresql"
            if postgres:
                cursor.execute("SET LOCAL mado.audit_prune = 'on'")
            cursor.execute(f"DELETE FROM {table} WHERE created_at < %s", [cutoff])
            deleted = cursor.rowcount
            if postgres:  # closed again at once, even inside a caller's transaction
                cursor.execute("SET LOCAL mado.audit_prune = 'off'")
        self.stdout.write(f"deleted {deleted} audit records older than {days} days")
