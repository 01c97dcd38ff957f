"""psflow.Server: a C++ ps task inside this Python process (tf.train.Server's role)."""
from . import _psflow


class Server:
    """Server(cluster, job_name="ps", task_index=0, flags=None).join(), or Server.from_flags(flags).join()

    join() serves the variables placed on this ps task until the chief ends training, then returns
    (the task's work is done: exit 0). It raises a psflow.Error with the reason when the job was
    aborted or no worker came, and KeyboardInterrupt on Ctrl-C (the task stops serving). The GIL is
    released while it serves. `flags` (psflow.parse_flags()) gives the ps task's own flags
    (--worker_timeout_secs, --logdir, --metrics_port, security files ...); the cluster is `cluster`,
    not $TF_CONFIG.
    """

    def __init__(self, cluster, job_name="ps", task_index=0, flags=None):
        if not isinstance(cluster, _psflow.ClusterSpec):
            cluster = _psflow.ClusterSpec(cluster)
        if job_name != "ps":
            raise _psflow.InvalidArgumentError(
                f"Server: job_name='{job_name}': only ps tasks run a server; "
                "a worker trains through psflow.WorkerSession")
        self.cluster = cluster
        self.job_name = job_name
        self.task_index = int(task_index)
        self._flags = flags if flags is not None else _psflow._parse_flags(argv=[])

    @classmethod
    def from_flags(cls, flags):
        """The ps task that flags (psflow.parse_flags(), job_name "ps") describe: its cluster
        (ClusterSpec.from_flags), its task index and its own flags."""
        return cls(_psflow.ClusterSpec.from_flags(flags), job_name=flags.job_name, task_index=flags.task_index,
                   flags=flags)

    def join(self):
        _psflow._join_server(self.cluster, self.job_name, self.task_index, self._flags)
