"""On-demand profiles: torch.profiler captures armed by HTTP, their memory evidence and files. Imported by
the set-up (instrument) and the endpoint, never by a hook.
"""
