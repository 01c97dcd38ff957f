"""For the test scripts run as worker processes (data_script.py, ctr_files_script.py): every worker
waits for the others after opening its session (else a fast chief may finish before a slow-starting
worker connects), by files in a directory the test gives, for 120 s at most."""
import os
import time


def start_together(directory, sess):
    open(os.path.join(directory, f"ready.{sess.worker_index}"), "w").close()
    deadline = time.monotonic() + 120
    while len(os.listdir(directory)) < sess.num_workers and time.monotonic() < deadline:
        time.sleep(0.01)
