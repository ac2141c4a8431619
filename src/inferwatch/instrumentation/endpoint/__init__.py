"""Serving the metrics: the HTTP server and its app, the rendering (format negotiation, gzip), the helper
process that takes HTTP off the serving process, and the program hub that merges the processes of one
launched program.
"""
