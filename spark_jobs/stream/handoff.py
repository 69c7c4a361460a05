"""The file lists of mini-batches whose commits run behind the next batch's read.

Spark marks a micro-batch done when ``foreachBatch`` returns, and its restart starts after the last batch
marked done. A batch that came to the driver in its read returns before its merge and commits, which run
on the stream's commit thread while Spark reads the next batch's files; so before it returns, its file
list is recorded here (``<checkpoint>/handoff/<batch id>.json``, written whole or not at all). A restart
first replays every recorded batch the state has no commit of, as Spark replays a batch it had not marked
done, with the same files, batch id and (state as it was) watermark; records the state covers are removed.
"""

from __future__ import annotations

import json
import os

import pyarrow.fs as pafs

__all__ = ["Handoffs"]


class Handoffs:
    """The hand-off records of one stream checkpoint (a local path or a URI pyarrow can write)."""

    def __init__(self, checkpoint: str) -> None:
        where = checkpoint.rstrip("/") + "/handoff"
        if "://" in where:
            self.fs, self.dir = pafs.FileSystem.from_uri(where)
        else:
            self.fs, self.dir = pafs.LocalFileSystem(), os.path.abspath(where)

    def record(self, batch_id: int, files: list[str]) -> None:
        """Record a batch's files before Spark marks it done (a rename: never half a record)."""
        self.fs.create_dir(self.dir, recursive=True)
        temp, path = f"{self.dir}/.{batch_id}.json.tmp", self._path(batch_id)
        with self.fs.open_output_stream(temp) as out:
            out.write(json.dumps({"batch_id": batch_id, "files": files}).encode())
        self.fs.move(temp, path)

    def pending(self, done: int | None) -> list[tuple[int, list[str]]]:
        """The recorded batches after ``done`` (the state's last batch), in batch order."""
        found = []
        for batch_id in self._ids():
            if done is None or batch_id > done:
                with self.fs.open_input_stream(self._path(batch_id)) as src:
                    found.append((batch_id, list(json.loads(src.read())["files"])))
        return sorted(found)

    def forget(self, through: int | None) -> None:
        """Remove the records of batches up to ``through``: the state has their commits."""
        for batch_id in self._ids():
            if through is not None and batch_id <= through:
                self.fs.delete_file(self._path(batch_id))

    def _ids(self) -> list[int]:
        infos = self.fs.get_file_info(pafs.FileSelector(self.dir, allow_not_found=True))
        return [int(i.base_name[:-5]) for i in infos
                if i.type == pafs.FileType.File and i.base_name.endswith(".json") and i.base_name[:-5].isdigit()]

    def _path(self, batch_id: int) -> str:
        return f"{self.dir}/{batch_id}.json"
