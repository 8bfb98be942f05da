"""mindvl: native MindSpore multimodal training and deployment."""
__version__ = "0.1.0"
