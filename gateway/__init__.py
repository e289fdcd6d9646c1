"""evq's HTTP side: the aiohttp gateway that ``evq serve`` runs (native API, SQS, watches).

The Python clients and the command line are the public face, :mod:`evq`.
"""
