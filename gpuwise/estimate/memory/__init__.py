"""Will it run? Weights, KV cache, activations, training state and overhead; what fits. Pure."""
