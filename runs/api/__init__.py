"""The ``/api/v1/`` views of the runs app (docs/api.md): ``projects`` (Projects, members, Datasets,
Codes) and ``runs`` (Runs and metrics); serializers in ``serializers``. Routed by ``config.api_urls``."""
