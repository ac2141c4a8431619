"""The hooks on one transformers model: the forward pre/post hooks, the generate wrapper, the compiled decode
path, the stopping criteria, speculative decoding, the KV cache's size, and the context (ModelContext)
each of them is given.
"""
