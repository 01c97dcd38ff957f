#!/usr/bin/env python3
"""psflow on a real full disk: a small tmpfs mounted in a private mount namespace
(`unshare --map-root-user --mount`, no privileges needed), so every write goes through the kernel
and fails with ENOSPC like a full volume would. Checks, with the real `psflow` binary and MNIST:

  1. checkpoints on a disk that fills up: the periodic save that does not fit is reported in one
     line and training goes on; the final save fails the run with one line (exit 1) naming the file
     and the cause; the checkpoint that fitted is byte-identical to the same step of a clean run
     on a real disk, and `psflow eval` loads it; no temporary file is left.
  2. TensorBoard events and --metrics_json on a full disk: events are disabled with one log line,
     training finishes and prints its summary, the JSON fails in one line (exit 1), no temporary
     file is left.
  3. checkpoints of a cluster (`psflow local`, 1 ps + 2 workers) on a disk that fills up: the
     chief's failed periodic saves are reported once per interval, the final failure ends the job
     (the ps task exits 1 with the chief's line), the checkpoint that fitted loads.
  4. disk tables (--table_storage=disk) whose --table_dir fills up: the ps task's write-back fails,
     and the job ends (exit 1) with one line naming the ps task and the table; the checkpoints,
     on another disk, stay readable (`psflow eval` loads the newest) with no temporary file left.

Skipped (exit 77) where user namespaces or tmpfs mounts are not allowed.
Usage: full_disk_test.py --build BUILD_DIR --data_dir DATA_DIR
"""
import argparse
import filecmp
import os
import re
import shlex
import subprocess
import sys
import tempfile

parser = argparse.ArgumentParser()
parser.add_argument("--build", required=True)
parser.add_argument("--data_dir", required=True)
args = parser.parse_args()
psflow = os.path.join(os.path.abspath(args.build), "psflow")
data_dir = os.path.abspath(args.data_dir)
failures = []


def check(condition, what):
    print(("ok   " if condition else "FAIL ") + what)
    if not condition:
        failures.append(what)


def in_full_namespace(size, script):
    """Runs `script` (sh) with $D a fresh tmpfs of `size` bytes; returns (exit code, output)."""
    mount = f'mount -t tmpfs -o size={size} psflow_full "$D" || exit 77'
    run = subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c", f"{mount}\n{script}"],
                         env=dict(os.environ, D=full_dir), capture_output=True, text=True, timeout=300)
    return run.returncode, run.stdout + run.stderr


with tempfile.TemporaryDirectory(prefix="psflow_full_disk_") as work:
    full_dir = os.path.join(work, "full")  # the tmpfs is mounted here, inside the namespace only
    out = os.path.join(work, "out")        # a real directory both sides see
    os.makedirs(full_dir)
    os.makedirs(out)
    probe = subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c",
                            f"mount -t tmpfs -o size=65536 probe {shlex.quote(full_dir)}"], capture_output=True)
    if probe.returncode != 0:
        print("full_disk_test: cannot mount a tmpfs in a user namespace here; skipping:",
              probe.stderr.decode().strip())
        sys.exit(77)

    # A 16-unit mlp with Adam: every checkpoint is ~153 KB. A 256 KiB disk holds one, not two.
    train = (f"{shlex.quote(psflow)} train --model=mlp --hidden_units=16 --batch_size=50 --seed=5 "
             f"--intra_op_threads=1 --log_every=1000 --data_dir={shlex.quote(data_dir)}")
    clean = os.path.join(work, "clean")
    subprocess.run(shlex.split(train) + ["--train_steps=300", "--save_checkpoint_steps=100",
                                         f"--checkpoint_dir={clean}"], check=True, capture_output=True)

    # 1. Checkpoints on a disk that fills up.
    code, output = in_full_namespace(256 * 1024, f"""
{train} --train_steps=300 --save_checkpoint_steps=100 --checkpoint_dir="$D/ckpt" \
    >{out}/train.out 2>{out}/train.err
echo "exit=$?" >{out}/train.code
ls -a "$D/ckpt" >{out}/ls.txt
{shlex.quote(psflow)} eval --model=mlp --hidden_units=16 --data_dir={shlex.quote(data_dir)} \
    --checkpoint_dir="$D/ckpt" >{out}/eval.out 2>&1
cp "$D/ckpt/model.ckpt-100.safetensors" {out}/ 2>/dev/null
exit 0""")
    if code == 77:
        print("full_disk_test: the tmpfs mount failed; skipping")
        sys.exit(77)
    read = lambda name: open(os.path.join(out, name)).read() if os.path.exists(os.path.join(out, name)) else ""
    ckpt = f"{full_dir}/ckpt"
    err_lines = [l for l in read("train.err").splitlines() if l.strip()]
    print("train stderr:", err_lines)
    check(read("train.code").strip() == "exit=1", "the run exits 1 when its final checkpoint cannot be saved")
    check(err_lines == [f"psflow: error: cannot save checkpoint {ckpt}/model.ckpt-300.safetensors: cannot write "
                        f"{ckpt}/model.ckpt-300.safetensors.tmp: No space left on device; the previous checkpoints "
                        f"are kept"], "the final failure is one line naming the file and the cause")
    failed = [l for l in read("train.out").splitlines() if "checkpoint failed:" in l]
    print("periodic failures:", failed)
    check(len(failed) == 1 and "model.ckpt-200.safetensors.tmp: No space left on device" in failed[0],
          "the periodic save at step 200 failed with one line and training went on")
    check(read("ls.txt").split() == [".", "..", "model.ckpt-100.safetensors"],
          "the full disk holds the step-100 checkpoint and no temporary file")
    check(f"eval: {ckpt}/model.ckpt-100.safetensors global_step=100" in read("eval.out"),
          "psflow eval loads the step-100 checkpoint: " + read("eval.out").strip())
    check(os.path.exists(os.path.join(out, "model.ckpt-100.safetensors")) and
          filecmp.cmp(os.path.join(out, "model.ckpt-100.safetensors"),
                      os.path.join(clean, "model.ckpt-100.safetensors"), shallow=False),
          "it is byte-identical to the step-100 checkpoint of the same run on a real disk")

    # 2. Events and --metrics_json on a disk with one free page (4 KiB): the event file's records
    # outgrow it during training, and the JSON finds no room at the end.
    code, output = in_full_namespace(64 * 1024, f"""
dd if=/dev/zero of="$D/filler" bs=1024 count=60 2>/dev/null
{train} --train_steps=60 --save_summaries_steps=1 --logdir="$D/logs" --metrics_json="$D/metrics.json" \
    >{out}/m.out 2>{out}/m.err
echo "exit=$?" >{out}/m.code
ls -a "$D" >{out}/m.ls
exit 0""")
    m_err = [l for l in read("m.err").splitlines() if l.strip()]
    disabled = [l for l in read("m.out").splitlines() if "TensorBoard events disabled" in l]
    print("events:", disabled)
    print("metrics stderr:", m_err)
    check(len(disabled) == 1 and f"cannot write {full_dir}/logs/events.out.tfevents." in disabled[0] and
          disabled[0].endswith(": No space left on device"), "events are disabled with one line naming the file")
    check("final: model=mlp mode=single" in read("m.out") and "global_step=60" in read("m.out"),
          "training finished and printed its summary")
    check(read("m.code").strip() == "exit=1", "the run exits 1 when --metrics_json cannot be written")
    check(m_err == [f"psflow: error: cannot write --metrics_json={full_dir}/metrics.json: cannot write "
                    f"{full_dir}/metrics.json.tmp: No space left on device"],
          "the JSON failure is one line naming the file and the cause")
    check(read("m.ls").split() == [".", "..", "filler", "logs"], "no temporary JSON file is left")

    # 3. The same on a cluster (1 ps + 2 workers, sync, so the chief sees every global step): each
    # periodic save that does not fit is reported once (tried again at the next interval, not at
    # every step); the final save failing ends the job with that line; the checkpoint that fitted
    # loads.
    code, output = in_full_namespace(256 * 1024, f"""
{shlex.quote(psflow)} local --ps=1 --workers=2 --sync_replicas --model=mlp --hidden_units=16 --batch_size=50 --seed=5 \
    --log_every=1000 --data_dir={shlex.quote(data_dir)} --train_steps=300 --save_checkpoint_steps=100 \
    --checkpoint_dir="$D/ckpt" >{out}/c.out 2>&1
echo "exit=$?" >{out}/c.code
ls -a "$D/ckpt" >{out}/c.ls
{shlex.quote(psflow)} eval --model=mlp --hidden_units=16 --data_dir={shlex.quote(data_dir)} \
    --checkpoint_dir="$D/ckpt" >{out}/c.eval 2>&1
exit 0""")
    c_out = read("c.out").splitlines()
    failed = [l for l in c_out if "checkpoint failed:" in l]
    saved = [l for l in c_out if "saved checkpoint" in l]
    print("cluster:", saved, failed)
    check(read("c.code").strip() == "exit=1", "the cluster run exits 1")
    failed_steps = [int(re.search(r"model\.ckpt-(\d+)\.safetensors:", l).group(1)) for l in failed]
    check(len(saved) == 1 and "model.ckpt-100.safetensors" in saved[0], "the chief saved step 100")
    check(failed_steps == [200, 300] and
          all(l.startswith("[worker0] checkpoint failed: cannot save checkpoint ") and
              l.endswith(".tmp: No space left on device; the previous checkpoints are kept") for l in failed),
          f"the chief reported each failed periodic save once, at steps {failed_steps} (expected [200, 300]), "
          "and went on")
    final = (f"psflow: error: cannot save checkpoint {ckpt}/model.ckpt-300.safetensors: cannot write "
             f"{ckpt}/model.ckpt-300.safetensors.tmp: No space left on device; the previous checkpoints are kept")
    # The chief prints the line and aborts the ps task, which exits with it; `psflow local` stops the
    # other tasks as soon as the first of them exits, so one of the two copies may be cut short.
    check(f"[worker0] {final}" in c_out or f"[ps0] {final}" in c_out,
          "the final failure ends the job with that line")
    # Beside it, the chief's end-of-training marker for an evaluator ({"outcome": "failed", ...}:
    # docs/evaluator.md) when its few bytes still fitted.
    check([f for f in read("c.ls").split() if f != "training_end.json"] == [".", "..", "model.ckpt-100.safetensors"],
          "the full disk holds the step-100 checkpoint and no temporary file")
    check(f"eval: {ckpt}/model.ckpt-100.safetensors global_step=100" in read("c.eval"),
          "psflow eval loads it: " + read("c.eval").strip())

    # 4. Disk tables on a 1 MiB --table_dir: RocksDB's first table file does not fit (the rows move
    # through a 30 kB cache, so every step writes rows back); the checkpoints go to a real disk.
    ck4 = os.path.join(out, "ck4")
    code, output = in_full_namespace(1024 * 1024, f"""
mkdir "$D/tables"
{shlex.quote(psflow)} local --ps=1 --workers=1 --model=ctr --ctr_fields=3 --ctr_dim=4 --ctr_vocab=0 --batch_size=96 \
    --seed=5 --ctr_test_examples=512 --train_steps=20000 --log_every=100000 --table_storage=disk \
    --table_dir="$D/tables" --table_cache_bytes=30000 --checkpoint_dir={shlex.quote(ck4)} \
    --save_checkpoint_steps=100 >{out}/t.out 2>&1
echo "exit=$?" >{out}/t.code
exit 0""")
    t_out = read("t.out").splitlines()
    errors = [l for l in t_out if l.startswith("[worker0] psflow: error: ")]
    print("disk tables:", errors)
    check(read("t.code").strip() == "exit=1", "the job with a full --table_dir exits 1")
    check(len(errors) == 1 and re.search(r"ps task 0, table 'field_0\d': writing rows back to disk in "
                                         + re.escape(full_dir) + r"/tables/ps_0/field_0\d failed: IO error: "
                                         r"No space left on device", errors[0]) is not None,
          "the chief ends the job with one line naming the ps task, the table and the full disk")
    saved = sorted(int(m) for m in re.findall(r"model\.ckpt-(\d+)\.safetensors", " ".join(os.listdir(ck4))))
    check(saved != [] and all(not f.endswith(".tmp") and ".tmp." not in f for f in os.listdir(ck4)),
          f"the checkpoints saved before it are there and no temporary file: {sorted(os.listdir(ck4))}")
    evaluated = subprocess.run([psflow, "eval", "--model=ctr", "--ctr_fields=3", "--ctr_dim=4", "--ctr_vocab=0",
                                "--seed=5", "--ctr_test_examples=512", f"--checkpoint_dir={ck4}"],
                               capture_output=True, text=True, timeout=120)
    check(evaluated.returncode == 0 and saved != [] and
          f"model.ckpt-{saved[-1]}.safetensors global_step={saved[-1]}" in evaluated.stdout,
          "psflow eval loads the newest of them: " + evaluated.stdout.strip() + evaluated.stderr.strip())

print(f"full_disk_test: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
