"""The admin API: sources, sinks, tokens and tasks of the stream registry at runtime."""
