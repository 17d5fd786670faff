"""How a served model behaves under load: a simulation of the runtime's scheduler, each step timed by the runtime's time model (docs/serve.md)."""
