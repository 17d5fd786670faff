"""Small training programs `gpuwise claims` runs as users' jobs are run: each in a process of
its own, under `gpuwise watch` or `gpuwise repro`, writing nothing to stdout."""
