"""The SDK declares a large checkpoint by its manifest's digest, so ``complete`` stays small
(docs/design/checkpoints.md#a-checkpoint)."""

import pytest

import mado_tracking
from checkpoints.models import Checkpoint, CheckpointState
from mado_tracking.declaration import INLINE_FILES, checkpoint_declaration

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_manifest_up_to_the_inline_count_travels_whole_and_a_larger_one_as_its_digest():
    small = [{"path": f"f{i}", "size": 0, "sha256": "0" * 64} for i in range(INLINE_FILES)]
    assert checkpoint_declaration(tar_size=1, tar_sha256="a" * 64, manifest=small)["manifest"] == small
    large = checkpoint_declaration(tar_size=1, tar_sha256="a" * 64, manifest=[*small, small[0] | {"path": "g"}])
    assert set(large) == {"tar_size", "tar_sha256", "manifest_sha256"} and len(large["manifest_sha256"]) == 64


def test_a_checkpoint_of_more_files_than_the_inline_count_completes_with_every_file(mmt_env, tmp_path):
    root = tmp_path / "many"
    for index in range(INLINE_FILES + 200):
        path = root / f"part-{index // 100}" / f"{index}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(str(index).encode())
    with mado_tracking.start_run() as run:
        saved = run.log_checkpoint(root, step=3)
    stored = Checkpoint.objects.get(pk=saved.id)
    assert stored.state == CheckpointState.COMPLETE and stored.file_count == INLINE_FILES + 200
    assert stored.manifest.get(path="part-11/1199.bin").size == 4
