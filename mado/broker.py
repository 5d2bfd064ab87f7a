"""The embedded broker: kombu's filesystem transport, writing whole messages only
(docs/deploy.md#messages-workers-and-outages).

kombu writes a message straight into the queue folder, so a worker polling the folder can move and read the file
before its bytes land, fail to parse the empty message and stop ("Unrecoverable error: JSONDecodeError"); the Jobs
sent to it then stay queued. Here a message is written under a name no reader takes (a leading dot and a
``.partial`` suffix: kombu takes only ``<time>_<uuid>.<queue>.msg``) and renamed into place once whole; a rename
within one folder is atomic.
"""

import os
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        """Put ``payload`` (a message dict) on ``queue``: written whole, then renamed in. Raises ``ChannelError`` when
        the folder cannot be written (as kombu's does)."""
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f".{name}.partial")
        try:
            with open(partial, "wb") as message:
                message.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            try:
                os.unlink(partial)
            except OSError:
                pass
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    """kombu's filesystem transport with ``Channel``'s whole-message writes."""

    Channel = Channel


def register() -> None:
    """Make ``filesystem://`` broker URLs use ``Transport`` (called by config/celery.py in every process); other
    schemes (``redis://``, ``amqp://``) are untouched."""
    from kombu.transport import TRANSPORT_ALIASES

    TRANSPORT_ALIASES["filesystem"] = "mado.broker:Transport"
