"""Every storage path the jobs touch besides Delta tables: landing files, the stream's checkpoint and hand-off
records, whole tables dropped by ``apply``.

One filesystem layer, pyarrow's: a local path, a ``file:`` URI as Spark hands them out, or any URI pyarrow
resolves (``s3://``, ``gs://``, ``hdfs://``). Moving the lake or the landing area to an object store changes
this module, and the jobs do not notice.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, cast
from urllib.parse import unquote, urlparse

import pyarrow.fs as pafs

__all__ = ["delete_file", "delete_tree", "first_line", "is_dir", "is_remote", "list_dir", "local_path", "modified",
           "open_input", "read_bytes", "size", "write_whole"]


def is_remote(path: str) -> bool:
    return "://" in path and not path.startswith("file:")


def local_path(path: str) -> str:
    """A local path from a Spark file URI (``file:/a%20b/x.parquet`` -> ``/a b/x.parquet``); others as given."""
    return unquote(urlparse(path).path) if path.startswith("file:") else path


def _resolve(path: str) -> tuple[pafs.FileSystem, str]:
    if is_remote(path):
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), os.path.abspath(local_path(path))


def _info(path: str) -> pafs.FileInfo:
    fs, where = _resolve(path)
    return fs.get_file_info(where)


def is_dir(path: str) -> bool:
    return _info(path).type == pafs.FileType.Directory


def size(path: str) -> int:
    """A file's size in bytes; -1 when it cannot be opened."""
    try:
        info = _info(path)
    except OSError:
        return -1
    return info.size if info.type == pafs.FileType.File and info.size is not None else -1


def modified(path: str) -> float:
    """A file's modification time, in seconds since the epoch."""
    return (_info(path).mtime_ns or 0) / 1e9


def list_dir(directory: str, *, dirs: bool = False) -> list[str]:
    """The data files (or, with ``dirs``, the sub-directories) of ``directory``, sorted, as paths under it: names
    starting with ``.`` or ``_`` (Spark's and Delta's own) left out; none when it does not exist."""
    fs, where = _resolve(directory)
    wanted = pafs.FileType.Directory if dirs else pafs.FileType.File
    found = fs.get_file_info(pafs.FileSelector(where, allow_not_found=True))
    names = sorted(i.base_name for i in found if i.type == wanted and not i.base_name.startswith((".", "_")))
    return [f"{directory.rstrip('/')}/{name}" for name in names]


@contextmanager
def open_input(path: str) -> Iterator[IO[bytes]]:
    """A file opened for random-access reading (a Parquet footer, a CSV header)."""
    fs, where = _resolve(path)
    with fs.open_input_file(where) as handle:
        yield cast(IO[bytes], handle)


def read_bytes(path: str) -> bytes:
    with open_input(path) as handle:
        return handle.read()


def first_line(path: str, limit: int = 1 << 16) -> str:
    """The first line of a text file (a CSV header), at most ``limit`` bytes of it."""
    with open_input(path) as handle:
        head = handle.read(limit)
    return head.split(b"\n", 1)[0].decode("utf-8", errors="replace").rstrip("\r")


def write_whole(path: str, data: bytes) -> None:
    """Write a file whole or not at all: into a temporary name beside it, then renamed (one PUT on an object
    store, which is atomic there)."""
    fs, where = _resolve(path)
    parent, name = os.path.split(where)
    fs.create_dir(parent, recursive=True)
    temp = f"{parent}/.{name}.tmp"
    with fs.open_output_stream(temp) as out:
        out.write(data)
    fs.move(temp, where)


def delete_file(path: str) -> None:
    fs, where = _resolve(path)
    fs.delete_file(where)


def delete_tree(path: str) -> None:
    """Remove a directory and everything below it; nothing when it is not there."""
    fs, where = _resolve(path)
    if fs.get_file_info(where).type == pafs.FileType.Directory:
        fs.delete_dir(where)
