"""Continuous batching: transformers' ContinuousBatchingManager measured request by request and step by step,
with its paged KV cache.
"""
