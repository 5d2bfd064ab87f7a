import gc
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
application = get_wsgi_application()

from django.urls import get_resolver  # noqa: E402

from mado.allocator import tune_allocator  # noqa: E402
from mado.checks import require_secret_key  # noqa: E402 - needs the settings loaded above

require_secret_key("web")  # wherever gunicorn runs, the image or not
tune_allocator()  # checkpoint uploads stream 1 MiB chunks through three threads (docs/design/worker.md#fetch)
# The code and data loaded so far (objects that live as long as the process) leave the collector's view, so a
# full collection, run in whichever request thread triggers it, walks only what requests left behind
# (docs/design/resume.md#steps-continue; figures in docs/deploy.md, "Web process garbage collector"). The URL
# patterns come first, so the view modules they import are frozen too.
get_resolver().url_patterns  # noqa: B018 - loads every view module before the freeze
gc.collect()
gc.freeze()
