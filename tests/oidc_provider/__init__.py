"""A real OpenID Connect provider for the sign-in tests: django-oauth-toolkit's, run as its own small Django
project in its own process (``tests/e2e/test_oidc_sign_in.py`` starts it)."""
