"""inferwatch run: the command, its start-up hook inside the launched program (autoinstrument), and the
transformers serve integration per layout.
"""
