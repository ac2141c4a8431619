"""The switch of XID error events. They are not read by a collector of a poll: a thread of the poller's
waits on NVML's events (:class:`~inferwatch.exporter.xid.XidWatcher`) and counts each as it comes; this
registration gives it its ``--[no-]collector.xid`` flag beside the others."""

from __future__ import annotations

from .registry import Registration, register

register(Registration("xid", "XID error events (a thread waiting on NVML events)"))
