"""The provider's claims: the user name, e-mail and ``groups``, read at each sign-in from the JSON file
``OIDC_PROVIDER_GROUPS_FILE`` (``{username: [group, …]}``), so the test changes them between sign-ins."""

import json
import os
from pathlib import Path

from oauth2_provider.oauth2_validators import OAuth2Validator


class GroupsValidator(OAuth2Validator):
    oidc_claim_scope = None  # every claim, whatever the scopes asked

    def get_additional_claims(self, request):
        user = request.user
        groups = json.loads(Path(os.environ["OIDC_PROVIDER_GROUPS_FILE"]).read_text()).get(user.username, [])
        return {"preferred_username": user.username, "email": user.email, "groups": groups}
