"""What is exposed, and nothing that needs torch: the metric catalogue, one model's series bound to its
labels, histogram observations in batches, and the containment that counts inferwatch's own failures.
"""
