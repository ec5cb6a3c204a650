"""The LLM side: the openai SDK client, streaming chat, structured compaction calls, error mapping."""
