"""mado's ground: the permission policy, authentication, errors, API and settings helpers, the outbox.

It imports no app; the roof (settings, URL confs, the Celery app, management commands) is ``config``
(docs/design/house.md#layout).
"""
