"""``manage.py mado_token USERNAME``: print the user's API token, creating it if needed (docs/api.md)."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from rest_framework.authtoken.models import Token


class Command(BaseCommand):
    help = "Print USERNAME's API token for `Authorization: Bearer <token>`, creating it if needed."

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, username: str, **options):
        user_model = get_user_model()
        user = user_model.objects.filter(**{user_model.USERNAME_FIELD: username}).first()
        if user is None:
            raise CommandError(f"no user named {username!r}")
        token, _ = Token.objects.get_or_create(user=user)
        self.stdout.write(token.key)
