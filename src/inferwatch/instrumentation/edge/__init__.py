"""The HTTP edge of a serving process: ASGI/WSGI middleware that marks a request's arrival and watches its
response.
"""
