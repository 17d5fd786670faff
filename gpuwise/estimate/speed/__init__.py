"""How fast? The roofline per operation, device rates (spec or probed), page faults, step times. Pure."""
