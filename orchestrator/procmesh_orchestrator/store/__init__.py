"""Memory: threads and their message history around the processors, on SQLite or PostgreSQL."""
