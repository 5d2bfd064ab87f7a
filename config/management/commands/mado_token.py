"""``manage.py mado_token USERNAME [--name N] [--scope S] [--days D]``: create an API token for the user and print
its key, shown this once (docs/api.md#tokens)."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from mado.errors import UserError
from mado.models import TokenScope
from mado.tokens import api_token_create


class Command(BaseCommand):
    help = "Create an API token for USERNAME and print its key (shown once) for `Authorization: Bearer <token>`."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="a name to recognise the token by (default: made from the time)")
        parser.add_argument("--scope", default=TokenScope.WRITE, choices=TokenScope.values)
        parser.add_argument("--days", type=int, default=None, help="lifetime in days (default: the server's)")

    def handle(self, *args, username: str, name: str, scope: str, days: int | None, **options):
        user_model = get_user_model()
        user = user_model.objects.filter(**{user_model.USERNAME_FIELD: username}).first()
        if user is None:
            raise CommandError(f"no user named {username!r}")
        name = name or f"manage.py mado_token {timezone.now():%Y-%m-%d %H:%M:%S.%f}"
        try:
            _token, key = api_token_create(user=user, name=name, scope=scope, expires_in_days=days)
        except UserError as exc:
            raise CommandError(f"{exc.field}: {exc.detail}") from None
        self.stdout.write(key)
