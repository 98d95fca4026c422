"""Datasets through ``cluster.storage_path``: trials read their data where every Ray node can, not at the
driver's checkout.

The driver publishes each dataset file once under ``<storage>/datasets/<sha256 of the file>/<name>`` (a hard
link when the storage is on the same local disk, a copy otherwise; a pyarrow URI such as ``s3://`` is written
through pyarrow). Content-addressed, so a published file never changes and never needs locking. A trial
``fetch``es its file before training: a local or shared path is read in place, a URI is downloaded once per
node into a cache; a node that cannot read it fails with ``DatasetError`` naming the node and the location.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import uuid
from pathlib import Path

import pyarrow.fs as pafs

from pipeline.data.datasets import DatasetError, file_hash

DATASETS = "datasets"  # under the storage path, beside Ray Tune's sweep directories


def filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, path within it) of a local path or a URI."""
    if "://" in location:
        return pafs.FileSystem.from_uri(location)
    return pafs.LocalFileSystem(), location


def location_of(path: str, storage: str) -> str:
    """A ``path`` of ``storage``'s filesystem, written as ``storage`` is (a URI keeps its scheme)."""
    return path if "://" not in storage else f"{storage.split('://')[0]}://{path}"


def publish(path: Path, storage: str, sha256: str | None = None) -> str:
    """The location under ``storage`` where trials read ``path`` (written if not there yet); ``sha256``: the
    file's hash if the caller has it already (hashing a large file twice costs seconds)."""
    fs, root = filesystem(storage)
    folder = f"{root.rstrip('/')}/{DATASETS}/{sha256 or file_hash(path)}"
    target = f"{folder}/{path.name}"
    location = location_of(target, storage)
    if fs.get_file_info(target).size == path.stat().st_size:
        return location
    fs.create_dir(folder)
    if isinstance(fs, pafs.LocalFileSystem):
        tmp = Path(folder) / f".{path.name}.{uuid.uuid4().hex}"
        try:
            os.link(path, tmp)
        except OSError:  # another disk, or links not allowed
            shutil.copyfile(path, tmp)
        os.replace(tmp, target)  # whole or absent, for readers on any node
    else:
        pafs.copy_files(str(path), target, destination_filesystem=fs)  # object stores: whole on close
    return location


def fetch(location: str, node: str | None = None) -> Path:
    """A local path to read the dataset at ``location`` from, on this node (named ``node`` in errors); raises
    DatasetError if this node cannot read it."""
    try:
        if "://" not in location:
            with open(location, "rb"):
                return Path(location)
        fs, path = filesystem(location)
        cache = Path(tempfile.gettempdir()) / "capacity-atlas" / DATASETS / Path(path).parent.name
        local = cache / Path(path).name
        if not local.exists():
            cache.mkdir(parents=True, exist_ok=True)
            tmp = cache / f".{local.name}.{uuid.uuid4().hex}"
            pafs.copy_files(path, str(tmp), source_filesystem=fs)
            os.replace(tmp, local)
        return local
    except (OSError, ValueError) as err:  # pyarrow's errors are OSErrors
        raise DatasetError(
            f"node {node or socket.gethostname()} cannot read dataset {location} ({err}): every Ray "
            "node must see cluster.storage_path (a shared path, or a URI such as s3://...)"
        ) from None
