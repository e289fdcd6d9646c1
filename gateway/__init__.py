"""evq's HTTP side: the aiohttp gateway (``evq serve``), the Python clients and the CLI."""

from gateway.client import AsyncClient, Client

__all__ = ["AsyncClient", "Client"]
