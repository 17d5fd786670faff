"""How much of my result is noise? Spread, variance shares and runs needed, from repeated runs. Pure."""
