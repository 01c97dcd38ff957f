#!/usr/bin/python3
"""tests/netns/hosts.py itself: what the benchmarks on simulated hosts rely on beyond the links
(bench/overlap_hosts.py's --congestion). No psflow task runs.

  tests/netns/hosts_test.py [HostsTests.test_congestion]

Exits 77 (CTest SKIP) with the reason where network namespaces cannot be made.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hosts  # noqa: E402


class HostsTests(unittest.TestCase):
    def test_congestion(self):
        """Each congestion control a namespace may choose is what its sockets then use, the host's own
        default is left alone, and one it may not choose is refused naming those it may."""
        with open("/proc/sys/net/ipv4/tcp_allowed_congestion_control") as f:
            allowed = f.read().split()
        with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
            machine = f.read().strip()
        with hosts.Network() as net:
            a, b = net.add_host("a"), net.add_host("b")
            for name in allowed:
                net.set_congestion(a, name)
                self.assertEqual(net.congestion(a), name)
            self.assertEqual(net.congestion(b), machine)  # another namespace keeps its own
            with self.assertRaises(hosts.NetnsError) as refused:
                net.set_congestion(a, "no_such_congestion_control")
            self.assertIn("no_such_congestion_control", str(refused.exception))
            self.assertIn(" ".join(allowed), str(refused.exception))
            self.assertEqual(net.congestion(a), allowed[-1])  # unchanged by the refusal
        with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
            self.assertEqual(f.read().strip(), machine)


if __name__ == "__main__":
    reason = hosts.unavailable()
    if reason:
        print(f"SKIPPED: simulated hosts unavailable: {reason}")
        sys.exit(hosts.SKIP)
    unittest.main()
