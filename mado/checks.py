"""Start-up checks of production settings (docs/design/house.md#settings; docs/design/worker.md#subprocess)."""

from django.conf import settings
from django.core.checks import Error, Tags, register
from django.core.exceptions import ImproperlyConfigured

MISSING_SECRET_KEY = (
    "MADO_SECRET_KEY is not set: set MADO_SECRET_KEY (or MADO_SECRET_KEY_FILE, a file holding it) to a long "
    'random value, e.g. the output of: python -c "import secrets; print(secrets.token_urlsafe(50))". '
    "Only a development server (MADO_DEBUG=1) runs without one."
)


def require_secret_key() -> None:
    """Raise ``ImproperlyConfigured`` naming ``MADO_SECRET_KEY`` when production (``MADO_DEBUG`` off) has none.

    Called where the web server starts (``config/wsgi.py``): without its own
    key the server would sign sessions and CSRF tokens with the public
    development key in the repository.
    """
    if not settings.DEBUG and not settings.MADO_SECRET_KEY_SET:
        raise ImproperlyConfigured(MISSING_SECRET_KEY)


@register(Tags.security, deploy=True)
def check_secret_key(app_configs, **kwargs) -> list[Error]:
    """``manage.py check --deploy``: error ``mado.E001`` when ``MADO_SECRET_KEY`` is not set."""
    if settings.MADO_SECRET_KEY_SET:
        return []
    return [Error(MISSING_SECRET_KEY, id="mado.E001")]
