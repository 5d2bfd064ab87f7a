"""The provider's claims, read at each sign-in from two JSON files the test rewrites between sign-ins:
``OIDC_PROVIDER_GROUPS_FILE`` (``{username: [group, …]}``: the ``groups`` claim) and, when it exists,
``OIDC_PROVIDER_CLAIMS_FILE`` (``{username: {"claims": {…}, "id_token": {…}, "userinfo": {…}, "alg": "none"}}``):
claims given in both answers, claims written over the ID token's own (``iat``, ``nbf``, ``azp``…) or the
userinfo's (``sub``), and an ID token sent unsigned. A misbehaving or hostile provider, on the real protocol."""

import base64
import json
import os
from pathlib import Path

from oauth2_provider.oauth2_validators import OAuth2Validator


def _read(variable: str) -> dict:
    path = Path(os.environ.get(variable, "/nonexistent"))
    return json.loads(path.read_text()) if path.is_file() else {}


def _changes(request, part: str):
    return _read("OIDC_PROVIDER_CLAIMS_FILE").get(request.user.username, {}).get(part, {})


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class GroupsValidator(OAuth2Validator):
    oidc_claim_scope = None  # every claim, whatever the scopes asked

    def get_additional_claims(self, request):
        user = request.user
        groups = _read("OIDC_PROVIDER_GROUPS_FILE").get(user.username, [])
        claims = {"preferred_username": user.username, "email": user.email, "groups": groups}
        return {**claims, **_changes(request, "claims")}

    def get_id_token_dictionary(self, token, token_handler, request):
        claims, expiration_time = super().get_id_token_dictionary(token, token_handler, request)
        return {**claims, **_changes(request, "id_token")}, expiration_time

    def get_userinfo_claims(self, request):
        return {**super().get_userinfo_claims(request), **_changes(request, "userinfo")}

    def finalize_id_token(self, id_token, token, token_handler, request):
        signed = super().finalize_id_token(id_token, token, token_handler, request)
        if _changes(request, "alg") != "none":
            return signed
        payload = signed.split(".")[1]
        return f"{_b64(json.dumps({'alg': 'none', 'typ': 'JWT'}).encode())}.{payload}."
