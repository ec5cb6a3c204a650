"""The web blueprint: the chat page, hydration, clearing a thread, health."""
