"""mindvl: native MindSpore multimodal training and deployment."""
__version__ = "0.1.0"


def from_pretrained(path, image_size=None):
    """A converted pretrained encoder (a folder written by `mindvl convert`) as a ready cell with its
    weights; see mindvl.pretrained.from_pretrained. Imported lazily: `import mindvl` stays light."""
    from mindvl.pretrained import from_pretrained as load

    return load(path, image_size=image_size)
