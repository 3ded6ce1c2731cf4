"""Callbacks that profile training run by other frameworks (Hugging Face Trainer, Lightning)."""
