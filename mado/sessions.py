"""Page sessions whose table holds no usable key (docs/design/interfaces.md#page-security).

Django's database backend, with one change: the ``django_session`` row of a session is stored under a digest of
its key, never the key. The browser's cookie holds the key (32 random characters from Django, about 165 bits), so
a copy of the table (a backup, a replica, a dump) signs nobody in, while logging out still deletes the row and
ends the session everywhere, which signed-cookie sessions cannot do. ``SESSION_ENGINE = "mado.sessions"``.
"""

import hashlib

from django.contrib.sessions.backends import db
from django.utils import timezone

# The column's width (Session.session_key is 40 characters): 160 bits of SHA-256 in hex. Django's own keys are
# 32 characters, so a row written before this backend is never found under a digest (its user signs in again).
STORED_KEY_LENGTH = 40


def stored_key(session_key: str) -> str:
    """The ``django_session.session_key`` of the session whose cookie value is ``session_key``: the first 40 hex
    digits of its SHA-256. Unkeyed: the key is random, so nothing can be guessed from the digest, and changing
    ``MADO_SECRET_KEY`` does not move rows."""
    return hashlib.sha256(session_key.encode()).hexdigest()[:STORED_KEY_LENGTH]


class SessionStore(db.SessionStore):
    """Django's database session store reading and writing each row under ``stored_key(key)``; ``session_key``
    stays the cookie's value. Expiry, ``clearsessions``, ``cycle_key`` on sign-in and ``flush`` on sign-out work
    as in Django's backend."""

    def _get_session_from_db(self):
        try:
            return self.model.objects.get(session_key=stored_key(self.session_key), expire_date__gt=timezone.now())
        except self.model.DoesNotExist:
            self._session_key = None

    async def _aget_session_from_db(self):
        try:
            return await self.model.objects.aget(
                session_key=stored_key(self.session_key), expire_date__gt=timezone.now()
            )
        except self.model.DoesNotExist:
            self._session_key = None

    def exists(self, session_key):
        return super().exists(stored_key(session_key))

    async def aexists(self, session_key):
        return await super().aexists(stored_key(session_key))

    def create_model_instance(self, data):
        row = super().create_model_instance(data)
        row.session_key = stored_key(row.session_key)
        return row

    async def acreate_model_instance(self, data):
        row = await super().acreate_model_instance(data)
        row.session_key = stored_key(row.session_key)
        return row

    def delete(self, session_key=None):
        session_key = session_key or self.session_key
        if session_key:
            super().delete(stored_key(session_key))

    async def adelete(self, session_key=None):
        session_key = session_key or self.session_key
        if session_key:
            await super().adelete(stored_key(session_key))
