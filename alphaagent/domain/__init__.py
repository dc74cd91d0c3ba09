"""Domain logic written once for both backends: sessions, ownership, tools, the recorder and turns."""
