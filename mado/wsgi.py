import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mado.settings")
application = get_wsgi_application()

from mado.allocator import tune_allocator  # noqa: E402
from mado.checks import require_secret_key  # noqa: E402 - needs the settings loaded above

require_secret_key()
tune_allocator()  # checkpoint uploads stream 1 MiB chunks through three threads (SPEC F12)
