#!/usr/bin/python3
"""A DLRM-style click-through-rate model in PyTorch with its embedding tables on the ps tasks
(psflow.torch.EmbeddingBagCollection of EmbeddingBag tables, docs/recommendation.md), on docs/tables.md's synthetic CTR data
(psflow.CtrGenerator: 26 Zipf-distributed categorical fields (--ctr_fields), 13 dense features
(--ctr_dense), a known answer).

Model: dense features -> bottom MLP D-64-dim (D = --ctr_dense); one EmbeddingBag(sum) of dim --ctr_dim per field,
in one EmbeddingBagCollection;
the pairwise dot products of the F + 1 vectors; top MLP -> 128 -> 64 -> 1 logit. The tables use
--sparse_optimizer (default adagrad, TF's: accumulators from 0.1) at --sparse_learning_rate, the
dense layers --optimizer (default adam). --ctr_vocab=0 (default): dynamic tables keyed by the raw
int64 ids; N: fixed tables of N rows (ids mod N). The chief prints the test log-loss and AUC beside
the Bayes values (the true probabilities' figures) and puts them in the summary's `ctr` block.

Training files: --train_files='DIR/train-*.gz' (Criteo's layout, e.g. from `psflow data ctr-files`)
instead of the generator, read by psflow's C++ reader through the job's work queue
(psflow.data.CtrFiles: async workers take file slices from ps task 0 as they need them; sync takes
each worker's part of one fixed order), with --num_epochs, --shuffle_files, --max_bad_lines; the test
set from --test_files (its Bayes figures unknown: NaN). Training ends at the end of the data or at
--train_steps, whichever comes first.

    psflow data ctr-files --out=/tmp/ctr --files=4 --examples_per_file=100000 --gzip
    psflow local --workers=2 -- /usr/bin/python3 examples/pytorch/ctr_dlrm.py \
        --train_files='/tmp/ctr/train-*' --test_files=/tmp/ctr/test.gz --train_steps=100000

Data order (the generator): async, worker w's batch at its local step s is the generator's stream w at s; sync,
global batch s is stream 0's batch of (workers x batch_size) examples at s and worker w takes its
w-th slice, so R workers x B equal one worker x R*B. Each batch's ids are prefetched (sess.batches,
which learns each table's ids from the first step's forwards): one round trip per ps per step. The
progress line shows a running AUC and log-loss (sess.add_clicks).

    /usr/bin/python3 examples/pytorch/ctr_dlrm.py        # alone: an in-process ps task
    build/psflow local -- /usr/bin/python3 examples/pytorch/ctr_dlrm.py
    build/psflow local --ps=2 --workers=2 --sync_replicas -- /usr/bin/python3 examples/pytorch/ctr_dlrm.py
    with --checkpoint_dir=DIR the chief saves the tables with the dense layers; the same command
    again (any --ps) resumes from DIR's newest checkpoint (docs/recommendation.md#checkpoints)
    by hand, one process per task: ctr_dlrm.py --job_name=ps|worker --task_index=I --ps_hosts=... --worker_hosts=...
"""
import sys

import torch
import torch.nn as nn

import psflow

MODEL_NAME = "ctr_dlrm"
DEFAULTS = {"batch_size": 1024, "optimizer": "adam", "learning_rate": 1e-3, "sparse_optimizer": "adagrad",
            "sparse_learning_rate": 0.5, "train_steps": 300, "log_every": 50, "ctr_test_examples": 16384}


class DLRM(nn.Module):
    def __init__(self, fields, dim, vocab, num_dense=13):
        super().__init__()
        n = vocab if vocab > 0 else None  # None: a dynamic table (any int64 id)
        # Was: nn.EmbeddingBag(n, dim, mode="sum", sparse=True) per field. Rows drawn on the ps from (seed, id),
        # each table's seed derived from --seed and its name (tables.0, tables.1, ...). The collection looks
        # all fields up in one call (one leaf, one gradient per step); each field stays a table of its own.
        self.tables = psflow.torch.EmbeddingBagCollection(
            psflow.torch.EmbeddingBag(n, dim, mode="sum", initializer="truncated_normal:0:0.05")
            for f in range(fields))
        self.vocab = vocab
        self.bottom = nn.Sequential(nn.Linear(num_dense, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU())
        k = fields + 1
        self.register_buffer("iu", torch.triu_indices(k, k, offset=1))
        self.top = nn.Sequential(nn.Linear(dim + k * (k - 1) // 2, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                                 nn.Linear(64, 1))

    def forward(self, ids, dense):
        ids = ids % self.vocab if self.vocab > 0 else ids
        embedded = self.tables(ids)  # [B, fields] -> [B, fields, dim]: one id per bag
        b = self.bottom(dense)
        x = torch.cat([b.unsqueeze(1), embedded], dim=1)
        z = torch.bmm(x, x.transpose(1, 2))[:, self.iu[0], self.iu[1]]
        return self.top(torch.cat([b, z], dim=1)).squeeze(1)


def batches(gen, sess, batch_size):
    """This worker's batches (ids, dense, labels) as torch tensors sharing the generator's arrays.
    Batch k is asked for before step k-1 is pushed (to prefetch it), so its data step is the
    session's current one plus 1 (the first: the current one)."""
    first = True
    while True:
        s = sess.data_step + (0 if first else 1)
        first = False
        if sess.sync:  # global batch s, this worker's slice
            r, w = sess.num_workers, sess.worker_index
            ids, dense, labels = gen.batch(s, batch_size * r, 0)
            part = slice(w * batch_size, (w + 1) * batch_size)
            ids, dense, labels = ids[part], dense[part], labels[part]
        else:
            ids, dense, labels = gen.batch(s, batch_size, sess.worker_index)
        yield torch.from_numpy(ids), torch.from_numpy(dense), torch.from_numpy(labels)


def evaluate_fn(model, gen, n, flags):
    def evaluate():
        nan = float("nan")
        if flags.test_files:  # read by the C++ reader; a file's true probabilities are unknown
            test = psflow.data.read_ctr_files(flags.test_files, flags.ctr_fields, n, flags.max_bad_lines,
                                              num_dense=flags.ctr_dense)
            bayes = {"log_loss": nan, "auc": nan}
        else:
            test = gen.test_set(n)
            bayes = gen.bayes_metrics(n)
        n_test = len(test["labels"])
        ids, dense = torch.from_numpy(test["ids"]), torch.from_numpy(test["dense"])
        with torch.no_grad():
            logits = torch.cat([model(ids[i:i + 8192], dense[i:i + 8192]) for i in range(0, n_test, 8192)])
        p = torch.sigmoid(logits.double()).numpy()
        ctr = {"test_examples": n_test, "test_log_loss": psflow.log_loss(test["labels"], p),
               "test_auc": psflow.auc(test["labels"], p), "bayes_log_loss": bayes["log_loss"],
               "bayes_auc": bayes["auc"]}
        print(f"ctr_dlrm: test log-loss {ctr['test_log_loss']:.5f} (Bayes {ctr['bayes_log_loss']:.5f}), "
              f"test AUC {ctr['test_auc']:.5f} (Bayes {ctr['bayes_auc']:.5f}) on {n_test} examples", flush=True)
        return {"test_cross_entropy": ctr["test_log_loss"], "ctr": ctr}
    return evaluate


def main(argv):
    flags = psflow.parse_flags(argv, defaults=DEFAULTS)
    if flags.unparsed:  # this script has no flags of its own
        print(f"psflow: error: unknown flag {flags.unparsed[0]} (see psflow train --help)", file=sys.stderr)
        sys.exit(2)
    if flags.job_name == "ps":
        psflow.Server.from_flags(flags).join()
        return
    torch.manual_seed(flags.seed)
    gen = psflow.CtrGenerator(seed=flags.seed, num_fields=flags.ctr_fields, num_dense=flags.ctr_dense)
    model = DLRM(flags.ctr_fields, flags.ctr_dim, flags.ctr_vocab, flags.ctr_dense)
    loss_fn = nn.BCEWithLogitsLoss()
    with psflow.WorkerSession(model, flags, evaluate=evaluate_fn(model, gen, flags.ctr_test_examples, flags),
                              model_name=MODEL_NAME) as sess:
        files = psflow.data.CtrFiles(flags.train_files, sess) if flags.train_files else None
        data = files if files is not None else batches(gen, sess, flags.batch_size)
        # sess.batches prefetches the next batch's ids (learnt from the first step's forwards: column
        # f of the ids, % vocab): their rows come back with the step's push (one round trip per ps
        # per step).
        for ids, dense, labels in sess.batches(data):
            logits = model(ids, dense)
            loss = loss_fn(logits, labels)
            loss.backward()  # the dense layers' .grad, and each table's unique rows' gradients
            sess.add_clicks(torch.sigmoid(logits), labels)  # the progress line's running AUC and log-loss
            sess.step(loss.item())
        if files is not None:
            print(f"ctr_dlrm: worker {sess.worker_index}: training files: {files.examples_read} examples read"
                  f" ({files.slices_read} slices from the work queue), epoch(s) begun: {files.epochs_begun}, "
                  f"{files.bad_lines} bad lines skipped", flush=True)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except psflow.Error as e:
        print(f"psflow: error: {e}", file=sys.stderr)
        sys.exit(2 if isinstance(e, psflow.InvalidArgumentError) else 1)
