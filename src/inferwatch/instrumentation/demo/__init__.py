"""inferwatch demo: the built-in models (built from configs, nothing downloaded), the request stream, and its
summary.
"""
