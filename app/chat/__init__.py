"""The websocket chat: frames, the turn runner, compaction status events."""
