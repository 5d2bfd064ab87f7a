"""``python -m tests.oidc_provider.world CLIENT_ID SECRET REDIRECT_URI USER``: the provider's client and user (made
once; the user's ``groups`` claim comes from ``OIDC_PROVIDER_GROUPS_FILE``, see ``validator``)."""

import sys

import django

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from oauth2_provider.models import Application  # noqa: E402


def main(client_id: str, secret: str, redirect_uri: str, username: str) -> None:
    Application.objects.get_or_create(
        client_id=client_id,
        defaults={
            "name": "mado",
            "client_secret": secret,
            "hash_client_secret": False,
            "client_type": Application.CLIENT_CONFIDENTIAL,
            "authorization_grant_type": Application.GRANT_AUTHORIZATION_CODE,
            "redirect_uris": redirect_uri,
            "algorithm": Application.RS256_ALGORITHM,
            "skip_authorization": True,
        },
    )
    if not get_user_model().objects.filter(username=username).exists():
        get_user_model().objects.create_user(username, email=f"{username}@example.com", password="idp-password")


if __name__ == "__main__":
    main(*sys.argv[1:])
