"""The built-in presets: package data of grpo-tui, found through importlib.resources (see grpo_tui.config.store)."""
