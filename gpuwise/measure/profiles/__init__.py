"""What a runtime really does per family, measured on tiny models: saved activations and op counts
(tools/ writes them into catalog/data/)."""
