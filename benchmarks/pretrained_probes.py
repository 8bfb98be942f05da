"""Linear probes on frozen pretrained features of easy-VQA (issue 4): what DINOv2, MiniLM and Whisper
give before any multimodal training, on the quickstart's metrics.

    python benchmarks/pretrained_probes.py [--data-root mindvl_data] [--pretrained pretrained]
                                           [--cache feature_cache] [--image-size 112]

Builds the data root and converts the three encoders (`mindvl convert`) when missing, extracts the
features once through the feature cache (mindvl/pretrained/features.py; a second run only reads it),
then fits ridge probes on the training split (mindvl/eval/probes.py) and reports on the test split:
  VQA, text question     [image | question sentence embedding] -> answer
  VQA, spoken question   [image | Whisper mean token of a test-voice clip] -> answer
  image -> caption       image features mapped into MiniLM's space, ranked over every caption
  speech -> question     Whisper features mapped into MiniLM's space, ranked over every question
Clips are chosen as the loader chooses them (train voices for training, unseen test voices for test).
"""
import argparse
import os
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

os.environ.setdefault("GLOG_v", "3")


def _rows(root, split):
    from mindvl.data.records import read_split

    return read_split(root, split, ["sample_id", "image_id", "image", "question_id", "caption_id", "answer_id"])


def _clips(root):
    """(split, question_id) -> that split's clips of the question (pcm bytes), in the loader's order."""
    from mindvl.data.records import read_split

    clips = defaultdict(list)
    for row in sorted(read_split(root, "speech", ["question_id", "voice", "rate", "split", "pcm"]),
                      key=lambda r: (r["question_id"], r["voice"], r["rate"])):
        clips[(row["split"], int(row["question_id"]))].append(row["pcm"])
    return clips


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--data-root", default="mindvl_data")
    parser.add_argument("--pretrained", default="pretrained", help="folder of converted encoders")
    parser.add_argument("--cache", default="feature_cache")
    parser.add_argument("--image-size", type=int, default=112)
    args = parser.parse_args(argv)

    from mindvl.config import load_config
    from mindvl.data import load_meta
    from mindvl.data.build.builder import build_dataset
    from mindvl.eval.probes import accuracy, classification_probe, retrieval_probe, similarities
    from mindvl.eval.retrieval import recall_at_k
    from mindvl.pretrained import convert
    from mindvl.pretrained.features import FrozenEncoders

    cfg = load_config(args.config, [f"data.root={args.data_root}"])
    build_dataset(cfg, progress=False)
    folders = {}
    for source in ("dinov2", "minilm", "whisper-base"):
        folders[source] = Path(args.pretrained) / source
        if not (folders[source] / "config.json").is_file():
            convert(source, folders[source])
    encoders = FrozenEncoders(Path(args.cache), folders["dinov2"], folders["minilm"], folders["whisper-base"],
                              image_size=args.image_size)
    meta = load_meta(args.data_root)
    rows = {split: _rows(args.data_root, split) for split in ("train", "test")}
    clips = _clips(args.data_root)

    start = time.perf_counter()
    image_ids = sorted({int(r["image_id"]) for split in rows for r in rows[split]})
    first_bytes = {}
    for split in rows:
        for r in rows[split]:
            first_bytes.setdefault(int(r["image_id"]), r["image"])
    image = dict(zip(image_ids, encoders.images([first_bytes[i] for i in image_ids])))
    questions = encoders.texts(meta["questions"])
    captions = encoders.texts(meta["captions"])
    clip_keys = sorted(clips)
    flat = [pcm for key in clip_keys for pcm in clips[key]]
    features = iter(encoders.speech(flat, cfg.preprocess.sample_rate))
    speech = {key: [next(features) for _ in clips[key]] for key in clip_keys}
    extract_seconds = time.perf_counter() - start

    def table(split):
        r = rows[split]
        img = np.stack([image[int(x["image_id"])] for x in r])
        question = np.stack([questions[int(x["question_id"])] for x in r])
        voices = "train" if split == "train" else "test"
        spoken = np.stack([speech[(voices, int(x["question_id"]))][int(x["sample_id"]) % len(
            speech[(voices, int(x["question_id"]))])] for x in r])
        answers = np.array([int(x["answer_id"]) for x in r])
        return img, question, spoken, answers

    train, test = table("train"), table("test")
    classes = len(meta["answers"])
    results = {}
    for name, column in (("VQA, text question", 1), ("VQA, spoken question", 2)):
        probe = classification_probe(np.concatenate([train[0], train[column]], 1), train[3], classes)
        results[name] = f"{accuracy(probe, np.concatenate([test[0], test[column]], 1), test[3]):.1%}"
    majority = np.bincount(train[3], minlength=classes).argmax()
    results["majority baseline"] = f"{(test[3] == majority).mean():.1%} (always {meta['answers'][majority]!r})"

    def distinct_images(split):
        pairs = {int(x["image_id"]): int(x["caption_id"]) for x in rows[split]}
        ids = sorted(pairs)
        return np.stack([image[i] for i in ids]), np.array([pairs[i] for i in ids])

    train_images, train_captions = distinct_images("train")
    test_images, test_captions = distinct_images("test")
    probe = retrieval_probe(train_images, train_captions, captions)
    recall = recall_at_k(similarities(probe, test_images, captions), test_captions)
    results["image -> caption"] = f"R@1 {recall['R@1']:.1%}, R@5 {recall['R@5']:.1%} ({len(captions)} captions)"

    def clip_table(voices):
        keys = [key for key in clip_keys if key[0] == voices]
        return (np.stack([f for key in keys for f in speech[key]]),
                np.array([key[1] for key in keys for _ in speech[key]]))

    train_clips, train_targets = clip_table("train")
    test_clips, test_targets = clip_table("test")
    probe = retrieval_probe(train_clips, train_targets, questions)
    recall = recall_at_k(similarities(probe, test_clips, questions), test_targets)
    results["speech -> question"] = f"R@1 {recall['R@1']:.1%}, R@5 {recall['R@5']:.1%} ({len(questions)} questions)"

    print(f"linear probes on frozen features (DINOv2 ViT-S/14 at {args.image_size}, MiniLM-L6, Whisper base on "
          f"the clip), easy-VQA train {len(rows['train'])} / test {len(rows['test'])} examples")
    print(f"features: {len(image)} images, {len(questions) + len(captions)} texts, {len(flat)} clips in "
          f"{extract_seconds:.0f} s (a second run reads them from {args.cache})")
    for name, value in results.items():
        print(f"  {name:22s} {value}")


if __name__ == "__main__":
    main()
