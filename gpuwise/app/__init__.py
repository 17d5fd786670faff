"""One function per command: takes a plan, calls estimate/ and measure/, returns a typed
answer for report/ to render. The command line (cli/) and the Python API both call here."""
