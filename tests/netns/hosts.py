"""Simulated hosts for tests and benchmarks: every task in its own Linux network namespace.

    net = hosts.Network()                    # a bridge, in a namespace of its own
    ps0 = net.add_host("ps0")                # namespace + veth pair to the bridge + 10.231.0.N/24
    net.shape(ps0, "1gbit")                  # tc tbf on both ends of ps0's link (both directions)
    p = net.popen(ps0, ["build/psflow", "train", ...], log_path)   # `ip netns exec NS ...`
    net.link_down(ps0); net.link_up(ps0)     # the link drops every packet / carries again
    hosts.freeze(p); hosts.thaw(p)           # SIGSTOP / SIGCONT
    net.close()                              # kills what popen started, deletes the namespaces

Layout: one namespace `psfnet-<pid>-<k>-br` holds a bridge `br0` and, for each host, the bridge end
`hN` of a veth pair whose other end is `eth0` inside the host's namespace `psfnet-<pid>-<k>-hN`,
addressed 10.231.0.(10+N)/24. Nothing is created in the caller's namespace and no route leads out
of the bridge: the addresses exist only inside these namespaces, so two runs (even in parallel:
names carry the pid and a counter) never see each other, and nothing reaches a real network.

Link down is `ip link set hN down` on the bridge end: the host's eth0 loses carrier but keeps its
address and routes, so packets are silently lost both ways (a dead switch port or a cable pulled
mid-run) — the stall a peer cannot tell from a frozen task. `side="host"` downs eth0 instead.

Shaping is `tc qdisc ... tbf` (rate, burst, latency) on the egress of both ends; `netem` (delay,
loss) is not available on these machines.

Cleanup: close() is idempotent and also registered with atexit (SIGTERM exits through it); processes started by popen() get
PR_SET_PDEATHSIG=SIGKILL, so they die with the test even when it is killed; namespaces left by a
test that was killed -9 are removed by the next Network() (their pid no longer runs).

Where namespaces cannot be made (not root, no `ip`, no veth/bridge/tbf support), unavailable()
names the reason; tests print it and exit SKIP (77), CTest's SKIP_RETURN_CODE.

Not thread-safe: one thread drives a Network. Standard library only (runs under /usr/bin/python3).
"""
import atexit
import ctypes
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys

SKIP = 77  # exit status of a test that cannot run here (CTest SKIP_RETURN_CODE)
SUBNET = "10.231.0"  # private; exists only inside the namespaces a Network makes
PREFIX = "psfnet"

_counter = itertools.count()


class NetnsError(RuntimeError):
    pass


def _ip(*args, check=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {r.stderr.strip()}")
    return r


def _tc(*args):
    r = subprocess.run(["tc", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise NetnsError(f"`tc {' '.join(args)}` failed: {r.stderr.strip()}")


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale():
    """Deletes namespaces left by earlier runs whose process is gone (killed before cleanup)."""
    r = _ip("netns", "list", check=False)
    for line in r.stdout.splitlines():
        m = re.match(rf"({PREFIX}-(\d+)-\S+)", line)
        if m and int(m.group(2)) != os.getpid() and not _pid_alive(int(m.group(2))):
            _ip("netns", "del", m.group(1), check=False)


_availability = None


def unavailable():
    """None if namespaces, veth pairs, a bridge and tbf work here; else why not (one line)."""
    global _availability
    if _availability is not None:
        return _availability or None
    reason = ""
    if os.geteuid() != 0:
        reason = "network namespaces need root (run the test as root, or in a container with CAP_NET_ADMIN)"
    elif shutil.which("ip") is None or shutil.which("tc") is None:
        reason = "`ip` or `tc` is missing (apt-get install iproute2)"
    else:
        net = None
        try:
            net = Network()
            h = net.add_host("probe")
            net.shape(h, "100mbit")
        except (NetnsError, OSError) as e:
            reason = f"cannot make network namespaces here: {e}"
        finally:
            if net is not None:
                net.close()
    _availability = reason
    return reason or None


def _exit_on_sigterm():
    """SIGTERM (kill, a CI runner's timeout) exits through atexit, so close() still runs."""
    import threading
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def _die_with_parent():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Host:
    def __init__(self, name, index, ns):
        self.name, self.index, self.ns = name, index, ns
        self.addr = f"{SUBNET}.{10 + index}"
        self.bridge_if = f"h{index}"

    def __repr__(self):
        return f"Host({self.name}, {self.addr}, ns={self.ns})"


class Network:
    def __init__(self):
        remove_stale()
        self.base = f"{PREFIX}-{os.getpid()}-{next(_counter)}"
        self.bridge_ns = f"{self.base}-br"
        self.hosts = []
        self.procs = []
        self.closed = False
        atexit.register(self.close)
        _exit_on_sigterm()
        self._namespaces = []
        try:
            _ip("netns", "add", self.bridge_ns)
            self._namespaces.append(self.bridge_ns)
            _ip("-n", self.bridge_ns, "link", "set", "lo", "up")
            _ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.bridge_ns, "link", "set", "br0", "up")
        except Exception:
            self.close()
            raise

    def add_host(self, name):
        index = len(self.hosts) + 1
        if index > 200:
            raise NetnsError("at most 200 hosts per Network")
        ns = f"{self.base}-h{index}"
        _ip("netns", "add", ns)
        self._namespaces.append(ns)
        host = Host(name, index, ns)
        _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", host.bridge_if, "netns", self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "set", host.bridge_if, "master", "br0")
        _ip("-n", self.bridge_ns, "link", "set", host.bridge_if, "up")
        _ip("-n", ns, "addr", "add", f"{host.addr}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        self.hosts.append(host)
        return host

    def shape(self, host, rate, burst=None, latency="50ms", direction="both"):
        """tc tbf at `rate` (tc syntax: 1gbit, 40mbit) on host's link: 'out' shapes what the host
        sends, 'in' what it receives, 'both' both. burst defaults to 5 ms of traffic (>= 64 KiB,
        so a full GSO segment passes)."""
        if burst is None:
            burst = max(64 * 1024, int(_rate_bits(rate) / 8 * 0.005))
        args = ["root", "tbf", "rate", rate, "burst", str(burst), "latency", latency]
        if direction in ("out", "both"):
            _tc("-n", host.ns, "qdisc", "replace", "dev", "eth0", *args)
        if direction in ("in", "both"):
            _tc("-n", self.bridge_ns, "qdisc", "replace", "dev", host.bridge_if, *args)

    def unshape(self, host, direction="both"):
        """Removes the tbf of shape() (the link runs at veth speed again)."""
        if direction in ("out", "both"):
            _tc("-n", host.ns, "qdisc", "del", "dev", "eth0", "root")
        if direction in ("in", "both"):
            _tc("-n", self.bridge_ns, "qdisc", "del", "dev", host.bridge_if, "root")

    def link_down(self, host, side="bridge"):
        if side == "bridge":
            _ip("-n", self.bridge_ns, "link", "set", host.bridge_if, "down")
        else:
            _ip("-n", host.ns, "link", "set", "eth0", "down")

    def link_up(self, host, side="bridge"):
        if side == "bridge":
            _ip("-n", self.bridge_ns, "link", "set", host.bridge_if, "up")
        else:
            _ip("-n", host.ns, "link", "set", "eth0", "up")

    def set_congestion(self, host, name):
        """TCP congestion control `name` (net.ipv4.tcp_congestion_control) for the sockets host's
        tasks open from now on. A namespace may only choose what the machine's
        net.ipv4.tcp_allowed_congestion_control lists: NetnsError names them otherwise."""
        r = subprocess.run(["ip", "netns", "exec", host.ns, "sysctl", "-qw", f"net.ipv4.tcp_congestion_control={name}"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            with open("/proc/sys/net/ipv4/tcp_allowed_congestion_control") as f:
                allowed = f.read().strip()
            raise NetnsError(f"TCP congestion control '{name}' not allowed in a network namespace here "
                             f"(net.ipv4.tcp_allowed_congestion_control: {allowed})")

    def congestion(self, host):
        """The TCP congestion control host's new sockets use."""
        r = subprocess.run(["ip", "netns", "exec", host.ns, "cat", "/proc/sys/net/ipv4/tcp_congestion_control"],
                           capture_output=True, text=True, check=True)
        return r.stdout.strip()

    def link_stats(self, host):
        """Bytes and packets eth0 sent and received (the host's side of its link)."""
        base = f"/sys/class/net/eth0/statistics"
        r = subprocess.run(["ip", "netns", "exec", host.ns, "sh", "-c",
                            f"cat {base}/tx_bytes {base}/rx_bytes"], capture_output=True, text=True, check=True)
        tx, rx = (int(x) for x in r.stdout.split())
        return {"tx_bytes": tx, "rx_bytes": rx}

    def popen(self, host, argv, log_path=None, env=None):
        """Starts argv inside host's namespace (its output to log_path, appended); killed by close()."""
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL
        try:
            p = subprocess.Popen(["ip", "netns", "exec", host.ns, *argv], stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=env, preexec_fn=_die_with_parent)
        finally:
            if log_path:
                out.close()
        self.procs.append(p)
        return p

    def close(self):
        if self.closed:
            return
        self.closed = True
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGCONT)  # a frozen process must run to die cleanly
                    p.kill()
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for ns in reversed(self._namespaces):
            _ip("netns", "del", ns, check=False)
        self._namespaces = []
        try:
            atexit.unregister(self.close)
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def freeze(proc):
    proc.send_signal(signal.SIGSTOP)


def thaw(proc):
    proc.send_signal(signal.SIGCONT)


def _rate_bits(rate):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
    if not m:
        raise ValueError(f"rate '{rate}' is not like 40mbit or 1gbit")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
