"""The one path from decoded events to durable rows, shared by ``stepstream worker``
and ``stepstream ingest-file`` so both make exactly the same records.

Five parts, one job each:

* :class:`~stepstream.pipeline.folds.FoldCache`: the folds of the runs in memory
  (a cache of their durable state plus any unflushed thinking tail), LRU-bounded.
* :class:`~stepstream.pipeline.batch.RowBatch`: the rows of the next write, coalesced.
* :class:`~stepstream.pipeline.writer.BatchWriter`: writes a batch under the store
  fault policy (retry in place, or :class:`StoreFailed`).
* :class:`~stepstream.pipeline.ledger.Ledger` (worker only): what is durable and what
  may be committed, per partition.
* :class:`~stepstream.pipeline.journal.Journal`: per run, the events applied since its
  last state a store admitted (what a redo applies again).

:class:`~stepstream.pipeline.pipeline.Pipeline` wires them: :meth:`Pipeline.apply` folds one event into the open
batch (a thinking delta that only buffers becomes a *hold* in the ledger), and
:meth:`Pipeline.flush` seals the batch, writes it (deep rows first, then steps, run
records and fold states; one transaction on SQLite) and marks it durable.

Contracts:

* **Never a fold ahead of the store.** A batch is written whole, retried in place, or
  the process stops (:class:`StoreFailed`, whatever the write path raised, the
  dead-letter confirmation included); no batch is dropped while folds moved on, and a
  failed write stays failed, so nothing later is written ahead of it.
* **A stale refusal is redone, not dropped.** A run the store refuses (another owner
  wrote it further) is reloaded from the store and its journal applied again (late
  events there), and that is written before the refused batch's offsets are durable.
* **Group commit.** A batch is written when it holds ``batch_records`` (records
  consumed plus rows made) or is ``batch_seconds`` old; while the previous write is
  still in flight it goes on growing, up to ``GROWTH`` times ``batch_records``.
* **Bytes.** A batch is also full once the messages it settles reach ``batch_bytes``
  (the ``size`` given to :meth:`Pipeline.apply`), whether a write is in flight or
  not: it holds at most that plus one message, whatever the bodies weigh.
* **Bounds.** At most ``max_open_runs`` folds (the least recently used are flushed and
  dropped); a held message is at most ``max_hold_seconds`` old before its tail is
  flushed (trigger ``age``); idle tails flush after ``Limits.idle_seconds`` (``idle``);
  runs idle for ``evict_after_seconds`` and ended runs leave memory.
* **Determinism.** None of the timers closes a thinking step, so ordinals and final
  rows depend only on the events: a worker and ``ingest-file`` converge.
* Not thread-safe and not re-entrant: callers serialize calls.
"""

from stepstream.pipeline.batch import RowBatch
from stepstream.pipeline.ledger import Ledger
from stepstream.pipeline.pipeline import BATCH_BYTES, GROWTH, NotLoaded, Pipeline
from stepstream.pipeline.writer import StoreFailed

__all__ = ["BATCH_BYTES", "GROWTH", "Ledger", "NotLoaded", "Pipeline", "RowBatch", "StoreFailed"]
