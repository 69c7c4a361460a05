"""The file lists of mini-batches whose commits run behind the next batch's read.

Spark marks a micro-batch done when ``foreachBatch`` returns, and its restart starts after the last batch marked done.
A batch that came to the driver in its read returns before its merge and commits, which run on the stream's commit
thread while Spark reads the next batch's files; so before it returns, its file list is recorded here
(``<checkpoint>/handoff/<batch id>.json``, written whole or not at all). A restart first replays every recorded batch
the state has no commit of, as Spark replays a batch it had not marked done, with the same files, batch id and (state as
it was) watermark; records the state covers are removed."""

from __future__ import annotations

import json

from spark_jobs.lake import storage

__all__ = ["Handoffs"]


class Handoffs:
    """The hand-off records of one stream checkpoint (a local path or a URI pyarrow can write)."""

    def __init__(self, checkpoint: str) -> None:
        self.dir = checkpoint.rstrip("/") + "/handoff"

    def record(self, batch_id: int, files: list[str]) -> None:
        """Record a batch's files before Spark marks it done (written whole: never half a record)."""
        storage.write_whole(self._path(batch_id), json.dumps({"batch_id": batch_id, "files": files}).encode())

    def pending(self, done: int | None) -> list[tuple[int, list[str]]]:
        """The recorded batches after ``done`` (the state's last batch), in batch order."""
        return sorted((batch_id, list(json.loads(storage.read_bytes(self._path(batch_id)))["files"]))
                      for batch_id in self._ids() if done is None or batch_id > done)

    def forget(self, through: int | None) -> None:
        """Remove the records of batches up to ``through``: the state has their commits."""
        for batch_id in self._ids():
            if through is not None and batch_id <= through:
                storage.delete_file(self._path(batch_id))

    def _ids(self) -> list[int]:
        names = [p.rsplit("/", 1)[-1] for p in storage.list_dir(self.dir)]
        return [int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit()]

    def _path(self, batch_id: int) -> str:
        return f"{self.dir}/{batch_id}.json"
