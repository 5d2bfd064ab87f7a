"""``mado checkpoint restore``: what it refuses before it asks the server (the restore itself runs against a live
server in tests/worker/test_kubernetes_restore.py)."""

import pytest
from click.testing import CliRunner

from mado_tracking.cli import main

ENV = {"MMT_API_URL": "http://127.0.0.1:9", "MMT_API_TOKEN": "t"}


def restore(*args):
    return CliRunner().invoke(main, ["checkpoint", "restore", *args], env=ENV)


def test_it_refuses_a_directory_that_holds_something_else(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    done = restore("3", "--into", str(tmp_path))
    assert done.exit_code == 2 and "--into" in done.output and "is not empty" in done.output
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("checkpoint_id", ["0", "-1", "abc", "3;ls", ""])
def test_it_refuses_what_is_not_a_checkpoint_id(tmp_path, checkpoint_id):
    done = restore(checkpoint_id, "--into", str(tmp_path / "in"))
    assert done.exit_code == 2 and "CHECKPOINT_ID" in done.output


def test_an_unreachable_server_is_named_and_nothing_is_left(tmp_path):
    done = restore("3", "--into", str(tmp_path / "in"))
    assert done.exit_code == 1 and "cannot restore checkpoint 3" in done.output
    assert not (tmp_path / "in").exists()  # not even the directory it made
    mine = tmp_path / "mine"
    mine.mkdir()
    assert restore("3", "--into", str(mine)).exit_code == 1 and mine.is_dir()  # a directory it found stays
