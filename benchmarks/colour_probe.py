"""What DINOv2's states hold of easy-VQA's colours and shapes (issue 49: the vlm-s quickstart learns shapes, not
colours): a logistic regression on the mean-pooled patch states of a few layers, and on the mean pixel, fitted on
three quarters of N train images and scored on the rest.

    python benchmarks/colour_probe.py --dinov2 pretrained/dinov2 [--image-size 112] [--images 800]

The converted folder is `mindvl convert dinov2`'s. Prints the machine, then per feature the held-out accuracy of
colour (8 classes) and shape (3). 2026-12-06 (2-core Intel Xeon, AVX-512), 112 px, 800 images, colour / shape:
the final states 98.5% / 99.0%, layer 9 99.5% / 99.5%, layer 6 95.0% / 96.0%, layer 3 66.0% / 57.0%, the mean
pixel 42.5% / 39.0% (docs/quickstart.md).
"""
import argparse
import os
import time

import numpy as np

os.environ.setdefault("GLOG_v", "3")
TAPS = (2, 5, 8, 11)  # blocks whose outputs are probed (layers 3, 6, 9, 12)
COLOURS = {"red", "green", "blue", "black", "gray", "teal", "brown", "yellow"}
SHAPES = {"circle", "rectangle", "triangle"}


def labelled_images(count: int):
    """(image paths, colours, shapes) of the first `count` train images whose questions name both."""
    import easy_vqa

    colour, shape = {}, {}
    for _, answer, image in zip(*easy_vqa.get_train_questions()):
        if answer in COLOURS:
            colour[image] = answer
        if answer in SHAPES:
            shape[image] = answer
    kept = [i for i in sorted(colour) if i in shape][:count]
    paths = easy_vqa.get_train_image_paths()
    return [paths[i] for i in kept], np.array([colour[i] for i in kept]), np.array([shape[i] for i in kept])


def features(folder: str, paths, size: int, batch: int = 50):
    """{name: (images, width)} mean-pooled patch states of the tapped layers and the final norm, and the mean
    pixel."""
    import mindspore as ms
    from PIL import Image

    from mindvl.pretrained.dinov2 import IMAGE_MEAN, IMAGE_STD
    from mindvl.pretrained.store import load_converted

    ms.set_context(mode=ms.GRAPH_MODE)
    encoder = load_converted(folder, image_size=size)
    encoder.encoder.taps = TAPS
    found = {name: [] for name in (*(f"layer {t + 1}" for t in TAPS), "final", "mean pixel")}
    for start in range(0, len(paths), batch):
        pixels = np.stack([np.asarray(Image.open(p).convert("RGB").resize((size, size), Image.BICUBIC))
                           for p in paths[start:start + batch]]) / 255.0
        x = ((pixels - IMAGE_MEAN) / IMAGE_STD).astype(np.float32).transpose(0, 3, 1, 2)
        patches = encoder.patch_embed(encoder.patchify(ms.Tensor(x)))
        cls = ms.ops.tile(encoder.cls_token, (len(x), 1, 1))
        final, tapped = encoder.encoder.construct_tapped(ms.ops.concat((cls, patches), 1) + encoder.pos_embed, None)
        for k, tap in enumerate(TAPS):
            found[f"layer {tap + 1}"].append(tapped.asnumpy()[k][:, 1:].mean(1))
        found["final"].append(final.asnumpy()[:, 1:].mean(1))
        found["mean pixel"].append(pixels.reshape(len(x), -1, 3).mean(1))
    return {name: np.concatenate(parts) for name, parts in found.items()}


def main(argv=None) -> None:
    from sklearn.linear_model import LogisticRegression

    from mindvl.cells.kernels.machine import cpu_model, isa_flags, machine_kind

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dinov2", required=True, help="a folder of `mindvl convert dinov2`")
    parser.add_argument("--image-size", type=int, default=112)
    parser.add_argument("--images", type=int, default=800)
    args = parser.parse_args(argv)
    print(f"machine: {cpu_model()}; {machine_kind()} ({' '.join(isa_flags())}); {os.cpu_count()} cores")
    paths, colours, shapes = labelled_images(args.images)
    start = time.perf_counter()
    table = features(args.dinov2, paths, args.image_size)
    print(f"{len(paths)} images at {args.image_size} px, features in {time.perf_counter() - start:.1f} s")
    fit = len(paths) * 3 // 4
    for name, x in table.items():
        scores = [LogisticRegression(max_iter=2000).fit(x[:fit], y[:fit]).score(x[fit:], y[fit:])
                  for y in (colours, shapes)]
        print(f"{name:12s} colour {scores[0]:.1%}  shape {scores[1]:.1%}  (held out: {len(paths) - fit})")


if __name__ == "__main__":
    main()
