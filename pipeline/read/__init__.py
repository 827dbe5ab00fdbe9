"""Reading icefloe's tables back: pinned-snapshot queries and the Spark reader."""
