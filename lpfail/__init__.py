"""lpfail: an executable edition of Qiu & Yao, "Why Low-Precision Transformer Training Fails: An Analysis on
Flash Attention" (ICLR 2026). See README.md and the book."""
__version__ = "0.1.0"
