"""``mado code push`` against a live server: a folder becomes the next version of a Code, refused before sending
what the server would refuse, and the server's refusal printed."""

import hashlib
import io
import tarfile

import pytest

from checkpoints import storage
from runs.models import Code, CodeVersion
from tests.sdk.test_cli_jobs import _no_persistent_connections, mado, sent  # noqa: F401 - fixtures


def _stored_archive(version: CodeVersion) -> bytes:
    key, size = version.archive.storage_key, version.archive.size
    return b"".join(storage.blob_open_range(key=key, start=0, length=size))


# --- code push -------------------------------------------------------------------------------------


@pytest.fixture
def source_dir(tmp_path):
    root = tmp_path / "src"
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('hello')\n")
    (root / "pkg" / "util.py").write_text("X = 1\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    (root / "pkg" / "stale.pyc").write_bytes(b"\0")
    return root


def test_code_push_registers_the_folder_as_version_1_of_a_new_code_then_version_2(mado, creator, project, source_dir):
    entrypoint = "python train.py --steps 40 --note 'two words'"
    first = mado(
        "code", "push", source_dir, "--project", "vision", "--name", "trainer", "--entrypoint", entrypoint, user=creator
    )
    assert first.exit_code == 0, first.output
    version = CodeVersion.objects.get()
    assert first.output.splitlines()[0] == (
        f"code version {version.pk}: trainer v1 (code {version.code_id}, new) in project vision"
    )
    assert "entrypoint: python train.py --steps 40 --note 'two words'" in first.output
    assert version.entrypoint == ["python", "train.py", "--steps", "40", "--note", "two words"]
    archive = _stored_archive(version)
    assert hashlib.sha256(archive).hexdigest() == version.archive.sha256
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        assert sorted(tar.getnames()) == ["pkg", "pkg/util.py", "train.py"]  # no __pycache__, no *.pyc
        assert tar.extractfile("train.py").read() == b"print('hello')\n"
        assert {member.uid for member in tar.getmembers()} == {0}

    again = mado(
        "code",
        "push",
        source_dir,
        "--project",
        "vision",
        "--name",
        "trainer",
        "--entrypoint",
        "python train.py",
        "--quiet",
        user=creator,
    )
    assert again.exit_code == 0, again.output
    second = CodeVersion.objects.get(version=2)
    assert again.output == f"{second.pk}\n"
    assert second.code_id == version.code_id and Code.objects.count() == 1


def test_code_push_refuses_a_symbolic_link_before_sending_anything(mado, creator, project, source_dir):
    (source_dir / "data").symlink_to("/etc")
    result = mado(
        "code",
        "push",
        source_dir,
        "--project",
        "vision",
        "--name",
        "trainer",
        "--entrypoint",
        "python train.py",
        user=creator,
    )
    assert result.exit_code == 1
    assert f"{source_dir / 'data'}: symbolic links cannot be pushed" in result.output
    assert not Code.objects.exists()


@pytest.mark.parametrize(("entrypoint", "reason"), [("", "is empty"), ("python 'train.py", "No closing quotation")])
def test_code_push_refuses_an_entrypoint_that_is_not_a_command(mado, creator, project, source_dir, entrypoint, reason):
    result = mado(
        "code", "push", source_dir, "--project", "vision", "--name", "t", "--entrypoint", entrypoint, user=creator
    )
    assert result.exit_code == 2
    assert "--entrypoint" in result.output and reason in result.output
    assert not Code.objects.exists()


def test_code_push_says_why_the_server_refused(mado, viewer, outsider, project, source_dir):
    result = mado(
        "code", "push", source_dir, "--project", "vision", "--name", "t", "--entrypoint", "python train.py", user=viewer
    )
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: cannot push {source_dir} as code 't': ")
    assert "HTTP 403 forbidden" in result.output
    hidden = mado(
        "code",
        "push",
        source_dir,
        "--project",
        "vision",
        "--name",
        "t",
        "--entrypoint",
        "python train.py",
        user=outsider,
    )
    assert hidden.exit_code == 1 and "HTTP 404 not_found" in hidden.output
    assert not Code.objects.exists()
