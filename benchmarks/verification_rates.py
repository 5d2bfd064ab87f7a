"""``checkpoint_io.py --threads …``: the rate of the checkpoint verifier with each number of hashing threads, beside a
single SHA-256 pass over the same tar (docs/design/checkpoints.md#hash-threads)."""

import hashlib
import os
import statistics
import time
from pathlib import Path

MIB = 1024 * 1024


def verification_rates(directory: Path, work: Path, threads: list[int], repeats: int) -> None:
    """Print the rate of ``CheckpointVerifier`` (the server's and the restores' check: the format, every file's and
    the tar's SHA-256) over the checkpoint's tar, read from a file in 1 MiB chunks, with each number of
    ``threads`` (docs/design/checkpoints.md#hash-threads); each beside a single SHA-256 pass over the same tar,
    interleaved, ``repeats`` times; medians, and the ratio to the first thread count's rate."""
    from mado_tracking.tarstream import CheckpointTar
    from mado_tracking.tarverify import CheckpointVerifier, ManifestFile

    tar_path = work / "verify.tar"
    tar = CheckpointTar(directory)
    with open(tar_path, "wb") as out:
        for part in tar:
            out.write(part)
    manifest = [ManifestFile(entry["path"], entry["size"], entry["sha256"]) for entry in tar.manifest]
    size = tar_path.stat().st_size

    def verify(count: int) -> float:
        started = time.perf_counter()
        verifier = CheckpointVerifier(manifest, tar_size=size, threads=count)
        try:
            with open(tar_path, "rb") as source:
                while chunk := source.read(MIB):
                    verifier.feed(chunk)
            verifier.finish()
        finally:
            verifier.close()
        return time.perf_counter() - started

    seconds = {count: [] for count in threads}
    reference = []
    for _ in range(repeats):
        for count in threads:
            reference.append(sha256_single_pass_file(tar_path))
            seconds[count].append(verify(count))
    tar_path.unlink()
    sha = statistics.median(reference)
    first = statistics.median(seconds[threads[0]])
    load = ", ".join(f"{figure:.1f}" for figure in os.getloadavg())
    print(
        f"verification of the tar ({size:,} bytes; format + each file's + the tar's SHA-256), median of {repeats}, "
        f"load average {load} on {os.cpu_count()} CPUs; single SHA-256 pass {size / sha / 1e6:,.0f} MB/s "
        f"(all {', '.join(f'{size / s / 1e6:,.0f}' for s in reference)}):"
    )
    for count in threads:
        median = statistics.median(seconds[count])
        print(
            f"  {count} thread(s): {size / median / 1e6:,.0f} MB/s = {sha / median:.0%} of the single pass, "
            f"{first / median:.2f}x the {threads[0]}-thread rate "
            f"(all {', '.join(f'{size / s / 1e6:,.0f}' for s in seconds[count])} MB/s)"
        )


def sha256_single_pass_file(path: Path) -> float:
    """Seconds for one hashlib SHA-256 pass over one file, 1 MiB reads."""
    started = time.perf_counter()
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(MIB):
            digest.update(chunk)
    return time.perf_counter() - started
