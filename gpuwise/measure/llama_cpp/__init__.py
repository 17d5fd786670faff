"""Real llama.cpp runs on this machine through llama-cpp-python: random-weight GGUF models and
llama-bench style timing."""
