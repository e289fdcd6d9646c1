"""One-shot watches, the pure part: :mod:`watch.core` keeps keys' versions and the watchers
armed on them (no asyncio, no I/O), for the shards and the gateways alike. The gateway's
asyncio side (the per-process hub, the long-poll and WebSocket transports, the WebSocket
codec) is :mod:`gateway.watches`."""

__all__: list[str] = []
