"""Synthetic SLURP-style speech corpus: text, TTS rendering, augmentation, manifests."""
