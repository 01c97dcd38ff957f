"""psflow.DistributedBatchSampler: psflow's data order (docs/design.md#data-order) for a
torch.utils.data.Dataset, usable as a DataLoader's batch_sampler.

    with psflow.WorkerSession(model, flags) as sess:
        loader = DataLoader(dataset, batch_sampler=psflow.DistributedBatchSampler(dataset, sess))
        while not sess.should_stop():
            for x, y in loader:                     # one epoch (or until training ends)
                loss = loss_fn(model(x), y); loss.backward(); sess.step(loss)

The order is the C++ sampler's (psflow.BatchSampler over psflow/data/batcher.h, the one `psflow
train` uses), not a second implementation: the example stream is the concatenation of per-epoch
permutations of range(len(dataset)), each a function of (--seed, epoch); global batch k is stream
positions [k·N·B, (k+1)·N·B) and worker i of N takes [k·N·B + i·B, k·N·B + (i+1)·B) — its slice.

  * Sync mode: worker i's batch at global step g is slice i of global batch g, so the N workers'
    batches of a step are exactly one process's batch of N·B (sync N×B equals 1×N·B).
  * Async mode: the stream is cut in batches of B (the one-worker order) and each push claims a
    global step of its own, S; its worker's next batch is batch S + N - 1 (batches 0..N-1 being
    the workers' first). So the workers' streams are disjoint and together take the stream in
    order, whatever their speeds.
  * Resume: the position is the session's (WorkerSession.data_step): a job restored from a
    checkpoint at step S continues with global batch S (sync) or batches S + i (async, worker i),
    not at batch 0 — in async mode at most N - 1 batches pushed just before step S was reached are
    taken again, and a worker that (re)starts while the job runs may share up to N - 1 batches with
    the others.

Epochs: epoch e holds the global batches whose first stream position lies in
[e·len(dataset), (e+1)·len(dataset)); a batch that runs past the end takes its remaining examples
from the next epoch's permutation (no short batch, no dropped example). One iteration of the
sampler is the rest of the current epoch, and stops early once the session should stop.

Epochs are the job's: in async mode an epoch's batches are shared among the workers, and len() is
the number of batches of the epoch left to the whole job.

Prefetching DataLoaders (num_workers > 0) ask for batches ahead of the steps: the sampler then hands
out consecutive positions. In sync mode these are the session's positions (the global step
advances by one per step); in async mode they are not (the next batch is known only after the
push): use DataLoader(num_workers=0) there, or the same batch may go to two workers.
WorkerSession.batches() knows this: in async mode it does not read such a loader (or the sampler)
ahead, and announces each batch instead of prefetching the next one's rows.
"""
from . import _psflow


def draws_from_distributed_sampler(iterable):
    """Whether `iterable` is a DistributedBatchSampler or a DataLoader drawing its batches from one
    (a batch_sampler, or a sampler that DataLoader batches)."""
    if isinstance(iterable, DistributedBatchSampler):
        return True
    return any(isinstance(getattr(iterable, attr, None), DistributedBatchSampler) for attr in ("batch_sampler", "sampler"))


class DistributedBatchSampler:
    """DistributedBatchSampler(data_source, session, batch_size=None): yields lists of indices.

    data_source: the Dataset (or anything with len()), or the number of examples.
    session: the psflow.WorkerSession (open before the first iteration).
    batch_size: per worker (default: --batch_size)."""

    def __init__(self, data_source, session, batch_size=None):
        n = data_source if isinstance(data_source, int) else len(data_source)
        if n <= 0:
            raise _psflow.InvalidArgumentError(f"DistributedBatchSampler: the data source has {n} examples; give a "
                                               "non-empty Dataset")
        self.num_examples = int(n)
        self.session = session
        self.batch_size = int(batch_size if batch_size is not None else session._flags.batch_size)
        if self.batch_size <= 0:
            raise _psflow.InvalidArgumentError(
                f"DistributedBatchSampler: batch_size={self.batch_size} must be positive")
        self._sampler = None
        self._last = None  # the data step of the last batch handed out

    def _c_sampler(self):
        if self._sampler is None:
            s = self.session
            if not s._opened:
                raise _psflow.FailedPreconditionError(
                    "DistributedBatchSampler: iterate after the worker session is open (inside `with "
                    "psflow.WorkerSession(...) as sess:`)")
            self._sampler = _psflow.BatchSampler(self.num_examples, self.batch_size, s._session.data_worker_index,
                                                 s._session.data_num_workers, s._flags.seed)
        return self._sampler

    @property
    def examples_per_global_batch(self):
        """Stream positions per data step: N·B in sync mode, B in async mode."""
        return self.batch_size * self.session._session.data_num_workers

    def position(self):
        """The data step of the next batch: the session's, or the one after the last handed out
        when a prefetching loader ran ahead of the steps."""
        step = self.session.data_step
        return step if self._last is None else max(step, self._last + 1)

    def epoch_of(self, data_step):
        return data_step * self.examples_per_global_batch // self.num_examples

    @property
    def epoch(self):
        """The epoch of the next batch (0 for the first pass over the data)."""
        return self.epoch_of(self.position())

    def _first_of_epoch(self, e):  # the first global batch starting in epoch e
        per = self.examples_per_global_batch
        return -(-e * self.num_examples // per)

    def __len__(self):
        """Data steps of the current epoch left (sync: this worker's batches; async: the job's)."""
        if self._sampler is None and not self.session._opened:
            return -(-self.num_examples // self.batch_size)  # not known before open: one worker's
        p = self.position()
        return self._first_of_epoch(self.epoch_of(p) + 1) - p

    def __iter__(self):
        sampler = self._c_sampler()
        end = self._first_of_epoch(self.epoch_of(self.position()) + 1)
        while not self.session.should_stop():
            p = self.position()
            if p >= end:
                return
            self._last = p
            yield sampler.batch(p).tolist()
