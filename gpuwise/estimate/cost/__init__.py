"""Should I use a GPU at all, and rent or buy? Sizing, prices and the advice. Pure."""
