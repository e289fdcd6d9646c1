"""The ``evq`` command: :mod:`evq.cli.console` is its entry point, :mod:`evq.cli.main` its
parser and client commands (:mod:`evq.cli.messages`, :mod:`evq.cli.common`),
:mod:`evq.cli.handle` is ``evq handle``. It sits above everything it dispatches to: the
client, the server (``evq serve``), the handler runtime and the Spark pipeline.
"""
