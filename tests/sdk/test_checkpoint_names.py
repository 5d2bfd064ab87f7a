"""The checkpoint format's name, depth and collision rules, checked once (``tarformat.check_paths``), on hostile
names (docs/checkpoint-format.md#names-one-precedence, docs/design/checkpoints.md#names)."""

import unicodedata

import pytest

from mado_tracking.tarformat import Limits, ManifestMismatch, check_paths

NFC = unicodedata.normalize("NFC", "café.pt")
NFD = unicodedata.normalize("NFD", "café.pt")


@pytest.mark.parametrize(
    ("paths", "rule"),
    [
        (["aux.pt"], "device name on Windows"),
        (["CON"], "device name on Windows"),
        (["models/Com1/x.pt"], "device name on Windows"),
        (["lpt¹.bin"], "device name on Windows"),
        (["aux .tar.gz"], "device name on Windows"),
        (["model."], "ends with a dot or a space"),
        (["dir /x.pt"], "ends with a dot or a space"),
        (["x" * 256 + ".pt"], "longer than 255 bytes"),
        (["é" * 128], "longer than 255 bytes"),  # 256 UTF-8 bytes in 128 characters
        (["/".join(["d"] * 65 + ["f.pt"])], "deeper than 64 levels"),
        (["Model.pt", "model.pt"], "collides with 'Model.pt'"),
        ([NFC, NFD], "collides with"),
        (["A/x.pt", "a/y.pt"], "collides with 'A'"),
        (["model", "model/a.bin"], "needs 'model' as a directory, but it is a file"),
        (["model/a.bin", "model"], "needs 'model' as a directory, but it is a file"),
        (["MODEL", "model/a.bin"], "as a directory, but it is a file"),
        (["a.pt", "a.pt"], "appears twice"),
        (["../x.pt"], "not a normalised relative path"),
        (["a//b.pt"], "not a normalised relative path"),
        (["/etc/passwd"], "absolute"),
        (["a\\b.pt"], "backslash"),
        (["a\x00b"], "control character"),
        (["a\ud800b"], "not valid UTF-8"),
    ],
)
def test_a_hostile_name_is_refused_naming_the_file_and_the_rule(paths, rule):
    with pytest.raises(ManifestMismatch) as refused:
        check_paths(paths)
    assert refused.value.what == "path"
    assert rule in refused.value.detail
    named = [p for p in paths if repr(p)[1:-1][:40] in refused.value.detail]
    assert named or "\ud800" in paths[0]  # a lone surrogate is named as Python writes it


def test_a_new_path_is_checked_against_the_files_already_there_and_named():
    with pytest.raises(ManifestMismatch) as refused:
        check_paths(["weights/Model.pt", "config.json"], new="weights/model.pt")
    assert "'weights/model.pt' collides with 'weights/Model.pt'" in refused.value.detail


def test_acceptable_names_pass_and_come_back_in_order_the_new_one_last():
    fine = ["console.pt", "com10", "nul_.pt", "a/b/c.pt", "/".join(["d"] * 63 + ["f.pt"]), "x" * 255, NFC]
    assert check_paths(fine, new="model.safetensors") == [*fine, "model.safetensors"]


def test_the_limits_are_the_settings_ones():
    limits = Limits(depth=3, component_bytes=8)
    with pytest.raises(ManifestMismatch, match="deeper than 3 levels"):
        check_paths(["a/b/c/d"], limits)
    with pytest.raises(ManifestMismatch, match="longer than 8 bytes"):
        check_paths(["123456789"], limits)
