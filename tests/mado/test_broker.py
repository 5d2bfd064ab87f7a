"""The embedded broker writes whole messages only: while a message is being written no reader can take it, so a
worker never reads an empty message and stops (docs/deploy.md#messages-workers-and-outages)."""

import pytest
from kombu import Connection
from kombu.exceptions import ChannelError
from kombu.transport.virtual import Empty

from mado import broker


@pytest.fixture
def channel(tmp_path):
    folder = tmp_path / "queue"
    folder.mkdir()
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder), "processed_folder": str(tmp_path)}
    with Connection("filesystem://localhost//", transport=broker.Transport, transport_options=options) as connection:
        channel = connection.default_channel
        channel.folder = folder
        yield channel


def test_a_message_being_written_is_not_taken_and_comes_whole_once_written(channel, monkeypatch):
    seen_while_writing = []
    real = broker.str_to_bytes

    def writing(text):
        with pytest.raises(Empty):  # a polling worker finds nothing yet
            channel._get("jobs")
        seen_while_writing.extend(path.name for path in channel.folder.iterdir())
        return real(text)

    monkeypatch.setattr(broker, "str_to_bytes", writing)
    channel._put("jobs", {"body": "run job 7"})
    assert len(seen_while_writing) == 1 and seen_while_writing[0].endswith(".partial")
    assert channel._size("jobs") == 1
    assert channel._get("jobs") == {"body": "run job 7"}
    assert list(channel.folder.iterdir()) == []


def test_a_write_that_fails_leaves_nothing_behind(channel, monkeypatch):
    def failing(text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(broker, "str_to_bytes", failing)
    with pytest.raises(ChannelError, match="Cannot add file"):
        channel._put("jobs", {"body": "run job 8"})
    assert list(channel.folder.iterdir()) == []
