"""meshplan: plan, place, configure and autoscale LLM inference on GPU topology."""

__version__ = "0.1.0"
