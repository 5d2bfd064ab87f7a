"""Service accounts: a Project's non-human users, for CI pipelines and sweep agents (docs/api.md#service-accounts)."""

from django.conf import settings
from django.db import models

from runs.models.core import Project


class ServiceAccount(models.Model):
    """``user`` (its password unusable: it never signs in interactively) acts in ``project`` alone, with the role of
    its membership there, through the tokens Project admins make for it."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="service_account")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="service_accounts")
    name = models.SlugField(max_length=50)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="serviceaccount_unique_name")]

    def __str__(self):
        return f"{self.name} ({self.project.slug})"
