"""Stored checkpoints and Code archives for the worker tests.

``stored_checkpoint`` records a complete checkpoint the way the checkpoint
services leave one (tar Artifact, ManifestEntry rows, tar size and SHA-256)
for ``files``, while the storage may hold other bytes (``stored=``): that is
how a tampered or truncated object looks to the worker.
"""

import io
import tarfile
import textwrap
import zipfile

from checkpoints import storage
from checkpoints.models import Artifact, Checkpoint, CheckpointState, ManifestEntry
from mado_tracking.tarverify import ManifestFile
from tests.checkpoints.checkpoint_helpers import FILES, make_tar, member, sha

__all__ = [
    "TRAIN_PY",
    "code_archive",
    "FILES",
    "make_tar",
    "member",
    "sha",
    "stored_checkpoint",
    "manifest",
    "tar_gz",
    "zip_bytes",
    "store_blob",
]


def manifest(files: dict[str, bytes]) -> list[ManifestFile]:
    return [ManifestFile(path, len(data), sha(data)) for path, data in sorted(files.items())]


def store_blob(data: bytes, prefix: str = "tests") -> str:
    return storage.blob_write(source=io.BytesIO(data), prefix=prefix).key


def stored_checkpoint(
    run,
    step: int,
    files: dict[str, bytes] | None = None,
    *,
    stored: bytes | None = None,
    state: str = CheckpointState.COMPLETE,
    recorded: bytes | None = None,
) -> Checkpoint:
    """A complete checkpoint of ``run`` at ``step`` recorded for ``files`` and the tar ``recorded`` (size and
    SHA-256; default: the good tar of ``files``); the storage holds ``stored`` (default: that tar)."""
    files = FILES if files is None else files
    good = make_tar(files) if recorded is None else recorded
    key = store_blob(good if stored is None else stored, prefix=f"runs/{run.pk}")
    artifact = Artifact.objects.create(
        project=run.project,
        run=run,
        path=f"checkpoints/step-{step}.tar",
        size=len(good),
        sha256=sha(good),
        storage_key=key,
    )
    checkpoint = Checkpoint.objects.create(
        run=run,
        step=step,
        framework="pytorch",
        includes_optimizer=True,
        file_count=len(files),
        total_bytes=sum(len(d) for d in files.values()),
        artifact=artifact,
        tar_size=len(good),
        tar_sha256=sha(good),
        state=state,
        received={"size": len(good), "sha256": sha(good)},
    )
    ManifestEntry.objects.bulk_create(
        [ManifestEntry(checkpoint=checkpoint, path=f.path, size=f.size, sha256=f.sha256) for f in manifest(files)]
    )
    return checkpoint


def tar_gz(entries: list[tuple], *, mode: str = "w:gz") -> bytes:
    """A compressed tar of ``entries``: ``(name, data)`` files, ``(name, None)`` directories, or
    ``(name, data, type, linkname)`` raw members; ``name`` may start with ``./``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as tar:
        for entry in entries:
            name, data = entry[0], entry[1]
            info = tarfile.TarInfo(name)
            if len(entry) == 4:
                info.type, info.linkname = entry[2], entry[3]
                tar.addfile(info)
            elif data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o755 if name.endswith(".sh") else 0o644
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def zip_bytes(files: dict[str, bytes], *, symlinks: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o120777 << 16
            archive.writestr(info, target)
    return buffer.getvalue()


# The training code: reads its control file (argv[1]), records what it saw into the marker file (``marker``,
# or ``<marker_dir>/<MMT_RUN_ID>.json``), then prints, waits to be stopped or exits as told. The marker file
# only exists if the code started. Under torchrun the ranks wait for each other after the SIGTERM set-up.
TRAIN_PY = textwrap.dedent("""
    import json, os, pathlib, signal, stat, sys, time
    from lib.util import describe

    control = json.loads(pathlib.Path(sys.argv[1]).read_text())
    seen = {"pid": os.getpid(), "cwd": os.getcwd(), "env": dict(os.environ), "files": {}, "modes": {}}
    resume_dir = os.environ.get("MMT_RESUME_CHECKPOINT_DIR")
    if resume_dir:
        root = pathlib.Path(resume_dir)
        for path in [root, *sorted(root.rglob("*"))]:
            seen["modes"][str(path.relative_to(root))] = oct(stat.S_IMODE(path.stat().st_mode))
            if path.is_file():
                seen["files"][str(path.relative_to(root))] = path.read_bytes().decode("latin-1")
        seen["resume_file"] = json.loads(pathlib.Path(os.environ["MMT_RESUME_CHECKPOINT_FILE"]).read_text())
    marker = control.get("marker") or str(pathlib.Path(control["marker_dir"]) / (os.environ["MMT_RUN_ID"] + ".json"))
    pathlib.Path(marker).write_text(json.dumps(seen))
    print(describe(), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    for i in range(control.get("lines", 0)):
        print(f"line {i}")
    if control.get("ignore_term"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif control.get("wait"):
        def on_term(signum, frame):
            print("SIGTERM received, saving and exiting", flush=True)
            sys.exit(143)
        signal.signal(signal.SIGTERM, on_term)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # under torchrun: every rank has started before any goes on (the first exit stops the rest)
        pathlib.Path(f"{marker}.started-{os.environ['RANK']}").touch()
        deadline = time.monotonic() + 60
        while len(list(pathlib.Path(marker).parent.glob(pathlib.Path(marker).name + ".started-*"))) < world:
            if time.monotonic() > deadline:
                sys.exit("not every rank started within 60 s")
            time.sleep(0.05)
    if control.get("wait"):
        print("ready", flush=True)
        time.sleep(120)
    sys.exit(control.get("exit", 0))
""")
UTIL_PY = "def describe():\n    return 'training code started'\n"


def code_archive() -> bytes:
    """The training code above as a Code version archive (tar.gz with ``./`` paths and a package)."""
    return tar_gz(
        [
            ("./", None),
            ("./lib", None),
            ("./train.py", TRAIN_PY.encode()),
            ("./lib/__init__.py", b""),
            ("./lib/util.py", UTIL_PY.encode()),
        ]
    )
