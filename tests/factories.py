"""factory_boy factories for the models every test needs."""

import itertools
import secrets

import factory
from django.contrib.auth import get_user_model

from mado.tokens import api_token_create, key_digest, key_prefix, run_key_for
from runs.models import Code, CodeVersion, Dataset, DatasetVersion, Membership, Project, Role, Run


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("pw-123456")


class ProjectFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Project

    name = factory.Sequence(lambda n: f"Project {n}")
    slug = factory.Sequence(lambda n: f"project-{n}")


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    project = factory.SubFactory(ProjectFactory)
    role = Role.MEMBER


class RunFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Run

    project = factory.SubFactory(ProjectFactory)
    created_by = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"run-{n}")


class CodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Code

    project = factory.SubFactory(ProjectFactory)
    created_by = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"code-{n}")


class CodeVersionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = CodeVersion

    code = factory.SubFactory(CodeFactory)
    version = factory.Sequence(lambda n: n + 1)
    entrypoint = ["python", "train.py"]
    created_by = factory.SelfAttribute("code.created_by")


class DatasetFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Dataset

    project = factory.SubFactory(ProjectFactory)
    name = factory.Sequence(lambda n: f"dataset-{n}")


class DatasetVersionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = DatasetVersion

    dataset = factory.SubFactory(DatasetFactory)
    version = factory.Sequence(lambda n: f"v{n}")


_api_keys = itertools.count(1)


def api_key(user, *, scope: str = "admin", days: int | None = None) -> str:
    """A new API token of ``user`` (``scope`` admin: all the user's role allows) and its key, as a user makes one
    on the account page (``mado.tokens.api_token_create``)."""
    return api_token_create(user=user, name=f"test token {next(_api_keys)}", scope=scope, expires_in_days=days)[1]


def run_token(run, user):
    """A Run token of ``run`` acting as ``user``, with its ``key`` set (stored as a digest, as the jobs app does
    in ``run_token_issue``); for tests of Runs that have no Job."""
    from jobs.models import RunToken

    salt = secrets.token_hex(16)
    key = run_key_for(salt)
    token = RunToken.objects.create(run=run, user=user, salt=salt, prefix=key_prefix(key), digest=key_digest(key))
    token.key = key
    return token
