"""The device side, off the hot path: the background worker (deferred observations, pollers), the allocator
and NVML pollers, the busy ratio, device identities and hardware peaks.
"""
