"""Start-up checks of production settings (docs/design/house.md#settings; docs/design/worker.md#subprocess)."""

from django.conf import settings
from django.core.checks import Error, Tags, register
from django.core.exceptions import ImproperlyConfigured

MISSING_SECRET_KEY = (
    "MADO_SECRET_KEY is not set: set MADO_SECRET_KEY (or MADO_SECRET_KEY_FILE, a file holding it) to a long "
    'random value, e.g. the output of: python -c "import secrets; print(secrets.token_urlsafe(50))". '
    "Only a development server (MADO_DEBUG=1) runs without one."
)
# The roles that sign with the key (web: sessions and CSRF tokens; a worker: Run tokens) or start a release
# (migrate), so a Secret left out stops the first of them; the demo and manage.py's other commands run without it.
SECRET_ROLES = frozenset({"web", "worker", "beat", "migrate"})


def require_secret_key(role: str) -> None:
    """Raise ``ImproperlyConfigured`` naming ``MADO_SECRET_KEY`` when a production role (``MADO_DEBUG`` off) has none.

    ``role`` is the process's (``settings.MADO_ROLE``, the image's sub-command; ``"web"`` from
    ``config/wsgi.py`` wherever gunicorn runs): a role outside ``SECRET_ROLES`` is let through. Without its own
    key the process would sign sessions, CSRF tokens and Run tokens with the public development key in the
    repository (docs/deploy.md#secret-key).
    """
    if role in SECRET_ROLES and not settings.DEBUG and not settings.MADO_SECRET_KEY_SET:
        raise ImproperlyConfigured(f"{role} refuses to start: {MISSING_SECRET_KEY}")


@register(Tags.security, deploy=True)
def check_secret_key(app_configs, **kwargs) -> list[Error]:
    """``manage.py check --deploy``: error ``mado.E001`` when ``MADO_SECRET_KEY`` is not set."""
    if settings.MADO_SECRET_KEY_SET:
        return []
    return [Error(MISSING_SECRET_KEY, id="mado.E001")]
