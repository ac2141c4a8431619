"""When things happened: the CUDA-event clock, a request's arrival, the request and its token timeline, how a
failed request ended. What the model hooks record into; imports no hook.
"""
