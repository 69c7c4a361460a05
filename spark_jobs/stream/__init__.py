"""The stream: mini-batches of new landing files merged into the served tables, with a retraction changelog."""

from spark_jobs.stream.minibatch import BatchOutcome
from spark_jobs.stream.query import StreamSummary, run, source_stream

__all__ = ["BatchOutcome", "StreamSummary", "run", "source_stream"]
