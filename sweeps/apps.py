from django.apps import AppConfig

from mado.periodic import schedule_every_interval


class SweepsConfig(AppConfig):
    name = "sweeps"
    verbose_name = "Sweeps"

    def ready(self):
        schedule_every_interval("release-sweep-leases", "sweeps.tasks.release_sweep_leases")
        from sweeps import receivers

        receivers.connect()
