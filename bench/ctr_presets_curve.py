#!/usr/bin/python3
"""Test AUC against steps of the ctr model in one process (`psflow train --model=ctr`, default flags,
batch 1024) on the generator's two presets (issue 27.7, docs/tables.md#the-ctr-model-against-bayes):
criteo (Criteo's cardinalities: the default) and learnable (vocabularies capped at 100 ids, FM scale 2).
Both run at once (one process each); every --eval_every steps the trainer evaluates on the test set
and prints `eval at step S: ... test_auc=A (bayes B)`, collected into bench/plots/ctr_presets_P.dat
(step, AUC, Bayes AUC) as it comes, so a curve cut short is still plotted. Then gnuplot draws
docs/img/ctr_presets.png (bench/plot_ctr_presets.gp).

  bench/ctr_presets_curve.py [--build build] [--steps 20000] [--eval_every 1000] [--presets criteo,learnable]
  bench/ctr_presets_curve.py --plot_only      # redraw from the .dat files
"""
import argparse
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLOTS = os.path.join(ROOT, "bench", "plots")
EVAL = re.compile(r"eval at step (\d+): test_log_loss=\S+ \(bayes \S+\) test_auc=(\S+) \(bayes (\S+)\)")
FINAL = re.compile(r"ctr: test_log_loss=\S+ \(bayes \S+\) test_auc=(\S+) \(bayes (\S+)\)")
STEP = re.compile(r"global_step=(\d+)")


def plot():
    out = os.path.join(ROOT, "docs", "img", "ctr_presets.png")
    subprocess.run(["gnuplot", "-e", f"dir='{PLOTS}'; out='{out}'", os.path.join(ROOT, "bench", "plot_ctr_presets.gp")],
                   check=True)
    print("wrote", out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--eval_every", type=int, default=1000)
    p.add_argument("--presets", default="criteo,learnable")
    p.add_argument("--plot_only", action="store_true")
    a = p.parse_args()
    if a.plot_only:
        return plot()
    os.makedirs(PLOTS, exist_ok=True)
    procs = {}
    for preset in a.presets.split(","):
        cmd = [os.path.join(a.build, "psflow"), "train", "--model=ctr", f"--ctr_preset={preset}",
               f"--train_steps={a.steps}", f"--eval_every_steps={a.eval_every}", "--log_every=1000000"]
        print(" ".join(cmd), flush=True)
        procs[preset] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # Read both outputs line by line (a thread each would do; alternate with select instead).
    import selectors
    sel = selectors.DefaultSelector()
    files = {}
    for preset, proc in procs.items():
        files[preset] = open(os.path.join(PLOTS, f"ctr_presets_{preset}.dat"), "w")
        files[preset].write(f"# {preset}: step test_auc bayes_auc (psflow train --model=ctr --ctr_preset={preset})\n")
        sel.register(proc.stdout, selectors.EVENT_READ, preset)
    open_streams = len(procs)
    while open_streams:
        for key, _ in sel.select():
            preset = key.data
            line = key.fileobj.readline()
            if not line:
                sel.unregister(key.fileobj)
                open_streams -= 1
                continue
            m = EVAL.search(line)
            final = FINAL.search(line)
            if m:
                files[preset].write(f"{m.group(1)} {m.group(2)} {m.group(3)}\n")
            elif final:
                files[preset].write(f"{a.steps} {final.group(1)} {final.group(2)}\n")
            else:
                continue
            files[preset].flush()
            print(preset, line.strip(), flush=True)
    for preset, proc in procs.items():
        files[preset].close()
        if proc.wait() != 0:
            print(f"{preset}: exit {proc.returncode}")
    plot()


if __name__ == "__main__":
    main()
