import os

from django.apps import AppConfig
from django.db.backends.signals import connection_created

from mado.periodic import schedule_every_interval


def _name_the_session(sender, connection, **kwargs) -> None:
    """Tag each PostgreSQL session with this process's id (``pg_stat_activity.application_name``).

    An operator (or a fault test) can then tell which worker process holds a
    lock or waits for one, and kill or trace exactly that process.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('application_name', %s, false)", [f"mado:{os.getpid()}"])


class MadoConfig(AppConfig):
    name = "mado"
    verbose_name = "mado"

    def ready(self):
        from django.conf import settings

        from mado import (
            checks,  # registers the deploy checks
            signins,  # noqa: F401 - audits sign-ins through Django's signals
        )

        # Every process of a production role stops here, before it serves, runs or migrates anything.
        checks.require_secret_key(settings.MADO_ROLE)

        schedule_every_interval("flush-dispatches", "mado.tasks.flush_dispatches")
        schedule_every_interval("reap-undelivered", "mado.tasks.reap_undelivered")

        connection_created.connect(_name_the_session, dispatch_uid="mado-application-name")
