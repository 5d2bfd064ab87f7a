"""Who signs in and how (imported by ``config.settings``): single sign-on with OpenID Connect, passwords and their
throttling, trusted proxies, API tokens' lifetimes and the audit log's retention (docs/deploy.md#single-sign-on,
#sign-in-throttling, #trusted-proxies; docs/api.md#tokens, #audit)."""

import datetime

from django.core.exceptions import ImproperlyConfigured

from mado.env import env_bool, env_choice, env_int, env_list, env_networks, env_str

# Single sign-on with OpenID Connect (docs/deploy.md#single-sign-on): on when MADO_OIDC_CLIENT_ID is set.
OIDC_RP_CLIENT_ID = env_str("MADO_OIDC_CLIENT_ID", "")
OIDC_RP_CLIENT_SECRET = env_str("MADO_OIDC_CLIENT_SECRET", "")
OIDC_OP_AUTHORIZATION_ENDPOINT = env_str("MADO_OIDC_AUTHORIZATION_ENDPOINT", "")
OIDC_OP_TOKEN_ENDPOINT = env_str("MADO_OIDC_TOKEN_ENDPOINT", "")
OIDC_OP_USER_ENDPOINT = env_str("MADO_OIDC_USERINFO_ENDPOINT", "")
OIDC_OP_JWKS_ENDPOINT = env_str("MADO_OIDC_JWKS_ENDPOINT", "")
OIDC_RP_SIGN_ALGO = env_choice("MADO_OIDC_SIGN_ALGO", "RS256", ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512"))
OIDC_RP_SCOPES = env_str("MADO_OIDC_SCOPES", "openid email profile")
OIDC_USE_PKCE = True
OIDC_USE_NONCE = True
OIDC_TIMEOUT = 15
MADO_OIDC_ENABLED = bool(OIDC_RP_CLIENT_ID)
# Each external identity is (this issuer, the ID token's sub): required once sign-on is on.
MADO_OIDC_ISSUER = env_str("MADO_OIDC_ISSUER", "")
if MADO_OIDC_ENABLED and not MADO_OIDC_ISSUER:
    raise ImproperlyConfigured(
        "MADO_OIDC_ISSUER must be set when MADO_OIDC_CLIENT_ID is: the provider's issuer URL "
        "(its discovery document's issuer), which every ID token's iss must equal"
    )
# 1: a new subject whose provider says its e-mail is verified links to the one account with that address.
MADO_OIDC_LINK_VERIFIED_EMAIL = env_bool("MADO_OIDC_LINK_VERIFIED_EMAIL", False)
MADO_OIDC_CLOCK_SKEW_S = env_int("MADO_OIDC_CLOCK_SKEW_S", 60, minimum=0)  # seconds allowed for iat, nbf and exp
MADO_OIDC_PROVIDER_NAME = env_str("MADO_OIDC_PROVIDER_NAME", "your company account")
# The claim whose values map to Project roles, and the rules: "CLAIM_VALUE=PROJECT_SLUG:ROLE", comma-separated.
MADO_OIDC_ROLE_CLAIM = env_str("MADO_OIDC_ROLE_CLAIM", "groups")
MADO_OIDC_ROLE_RULES = env_list("MADO_OIDC_ROLE_RULES", [])
# 0: only the provider signs people in (the password form and Basic passwords are refused; tokens still work).
MADO_PASSWORD_LOGIN = env_bool("MADO_PASSWORD_LOGIN", True)
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: a locked-out account or address is refused before any check
    *(["runs.oidc.MadoOIDCBackend"] if MADO_OIDC_ENABLED else []),
    *(["django.contrib.auth.backends.ModelBackend"] if MADO_PASSWORD_LOGIN or not MADO_OIDC_ENABLED else []),
]
LOGIN_REDIRECT_URL_FAILURE = "/accounts/login/?sso=failed"
# Failed sign-ins throttled per account name and per address by django-axes (docs/deploy.md#sign-in-throttling).
MADO_LOGIN_FAILURE_LIMIT = env_int("MADO_LOGIN_FAILURE_LIMIT", 5, minimum=1)
MADO_LOGIN_LOCKOUT_S = env_int("MADO_LOGIN_LOCKOUT_S", 900, minimum=1)
AXES_FAILURE_LIMIT = MADO_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = datetime.timedelta(seconds=MADO_LOGIN_LOCKOUT_S)
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]  # either one locks: a guessed account, a guessing address
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = True
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "mado.addresses.client_address"
AXES_LOCKOUT_CALLABLE = "mado.signins.lockout_response"
AXES_DISABLE_ACCESS_LOG = True  # successful sign-ins are audit records (mado.signins)
AXES_VERBOSE = False
# Addresses or networks of the proxies in front of mado: only their X-Forwarded-For is read (mado/addresses.py).
MADO_TRUSTED_PROXIES = env_networks("MADO_TRUSTED_PROXIES", [])

# API tokens (docs/api.md#tokens): the lifetime a new token gets unless its creator picks one, and the longest.
MADO_TOKEN_DEFAULT_DAYS = env_int("MADO_TOKEN_DEFAULT_DAYS", 90, minimum=1)
MADO_TOKEN_MAX_DAYS = env_int("MADO_TOKEN_MAX_DAYS", 365, minimum=MADO_TOKEN_DEFAULT_DAYS)
# Audit records older than this many days are deleted by `manage.py audit_prune` (0: kept forever).
MADO_AUDIT_RETENTION_DAYS = env_int("MADO_AUDIT_RETENTION_DAYS", 0, minimum=0)
