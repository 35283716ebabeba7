"""grpo-tui: terminal dashboard and runner for GRPO fine-tuning."""

__version__ = "0.1.0"
