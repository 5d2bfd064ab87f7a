"""The installed version of ``mado-tracking`` (read from the package metadata)."""

from importlib import metadata

try:
    __version__ = metadata.version("mado-tracking")
except metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
