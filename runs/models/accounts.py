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


class IdentityLink(models.TextChoices):
    SIGN_UP = "sign-up", "first sign-in of a new subject"
    VERIFIED_EMAIL = "verified-email", "linked by the provider's verified e-mail"
    ADMIN = "admin", "linked by an admin"


class ExternalIdentity(models.Model):
    """A person at the identity provider, ``(issuer, subject)`` (the ID token's ``iss`` and ``sub``), and the one user
    it signs in as (docs/deploy.md#single-sign-on). The provider's user name and e-mail never pick the user: only
    this row does, made at the first sign-in of a new subject, by a verified e-mail where the operator allows it,
    or by an admin."""

    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="external_identities")
    linked_by = models.CharField(max_length=20, choices=IdentityLink.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "external identities"
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="externalidentity_unique_subject")]

    def __str__(self):
        return f"{self.subject} at {self.issuer}"
