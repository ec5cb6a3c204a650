"""Redis persistence: key names (``keys``), the connection (``redis_client``), the thread store."""
