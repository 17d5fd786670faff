"""Real runs in fresh processes (random weights): peak memory and times, to check estimates against."""
