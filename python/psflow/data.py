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


class CtrFiles:
    """CtrFiles(pattern, session, batch_size=None, ...): the job's training files in Criteo's layout
    (docs/data-files.md) as batches for a PyTorch worker: yields (ids int64 [B, F], dense float32
    [B, D], labels float32 [B]) torch tensors, read and parsed by psflow's C++ reader (no text
    parsing in Python), through the same work queue as `psflow train`'s workers:

      * async: slices of the files handed out by ps task 0 as this worker's slice is used up (a slow
        worker reads less); the queue's state is in every checkpoint, so a resumed job goes on where
        it stood, and a restarted worker's unfinished slice goes back to the queue (at-least-once
        per slice);
      * sync: worker w's part of global batch s of one fixed order (file order, or with shuffle an
        order of the files per epoch from --seed), from the session's data step on: sync N x B
        reads what one process of N*B reads.

    Composes with sess.batches (it may read one batch ahead):

        with psflow.WorkerSession(model, flags) as sess:
            files = psflow.data.CtrFiles(flags.train_files, sess)
            for ids, dense, labels in sess.batches(files):  # the tables' ids learnt from the first forwards
                ...

    Iteration ends at the end of the data (--num_epochs passes; the rest under a batch is unused)
    or once the session should stop. pattern: comma-separated globs (plain or gzip files).
    batch_size, num_fields, num_epochs, shuffle, file_slices (per worker, async), max_bad_lines,
    num_dense (D, the integer fields): default to the session's flags (--batch_size, --ctr_fields,
    --num_epochs, --shuffle_files, --file_slices, --max_bad_lines, --ctr_dense). A line with another
    number of fields fails naming file, line and the counts (--ctr_dense, --ctr_fields). A bad line fails with one line naming file and line number
    (psflow.InvalidArgumentError); --max_bad_lines=N skips up to N (bad_lines counts them)."""

    def __init__(self, pattern, session, batch_size=None, num_fields=None, num_epochs=None, shuffle=None,
                 file_slices=None, max_bad_lines=None, num_dense=None):
        f = session._flags

        def pick(value, default):
            return default if value is None else value

        self.session = session
        self._reader = _psflow._CtrFileReader(
            session._session, str(pattern), int(pick(batch_size, f.batch_size)), int(pick(num_fields, f.ctr_fields)),
            int(pick(num_epochs, f.num_epochs)), bool(pick(shuffle, f.shuffle_files)),
            int(pick(file_slices, f.file_slices)), int(pick(max_bad_lines, f.max_bad_lines)),
            int(pick(num_dense, f.ctr_dense)))

    def __iter__(self):
        import torch
        at_end = False
        try:
            while not self.session.should_stop():
                batch = self._reader.next()
                if batch is None:
                    at_end = True
                    return
                ids, dense, labels = batch
                yield torch.from_numpy(ids), torch.from_numpy(dense), torch.from_numpy(labels)
        finally:
            if not at_end:
                # Training ended before the files (by steps, or the loop left): the work queue's
                # slice being read goes back, or the chief would wait for it at the queue's end.
                try:
                    self._reader.stop()
                except Exception as e:  # the job is ending: say so, do not mask what ended it
                    import warnings
                    warnings.warn(f"psflow.data.CtrFiles: giving the unfinished slice back failed: {e}")

    @property
    def examples_read(self):
        """Examples this worker read so far (whole batches and the rest under a batch)."""
        return self._reader.examples_read

    @property
    def bad_lines(self):
        """Bad lines skipped so far (--max_bad_lines)."""
        return self._reader.bad_lines

    @property
    def epochs_begun(self):
        """The highest epoch this worker reached, plus one."""
        return self._reader.epochs_begun

    @property
    def slices_read(self):
        """Async: the work queue's slices this worker took."""
        return self._reader.slices_read


def read_ctr_files(pattern, num_fields=26, max_examples=65536, max_bad_lines=0, num_dense=13):
    """The first max_examples examples of files in Criteo's layout (e.g. --test_files), read by
    psflow's C++ reader: {"ids": int64 [n, F], "dense": float32 [n, D], "labels": float32 [n]}
    numpy arrays (F = num_fields categoricals, D = num_dense integers a line)."""
    return _psflow.read_ctr_files(str(pattern), int(num_fields), int(max_examples), int(max_bad_lines),
                                  int(num_dense))
