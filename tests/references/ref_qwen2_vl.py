"""Tiny random-weight Qwen2.5-VL and Qwen2-VL checkpoints in the Hugging Face layout, and transformers' outputs on
them and on real photos: the references of the native-resolution family (issue 49).

Each family gets a folder tests/references/tiny_<family>/ (config.json, model.safetensors, generation_config.json,
preprocessor_config.json, tokenizer.json: a 384-token byte-level BPE trained here, plus Qwen's chat and vision
special tokens) and arrays in qwen2_vl.npz:

  photo_<i>, processed_<i>_{pixels,grid}   real photos (scikit-image's astronaut, coffee, chelsea, rocket) cut and
                                           scaled to several sizes and aspect ratios, and the slow
                                           Qwen2VLImageProcessor's pixel_values and image_grid_thw of each (min and
                                           max pixels set so that both bounds are met by some photo)
  <family>_vision_<case>                   the vision tower's merged output for the cases' images
  <family>_{ids,logits,greedy}_<case>      a prompt's ids, every position's logits and 32 greedy tokens, for the
                                           cases: one image, two images of different sizes (one with a partial
                                           window), a video (4 frames, its pixels patchified as the image
                                           processor does, since the video processor needs torchvision), and text

Run with torch 2.13 and transformers 4.57 (`pip install torch==2.13.0 "transformers>=4.53,<5" scikit-image`).
"""
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
FAMILIES = ("qwen2_5_vl", "qwen2_vl")
TRAINING_TEXT = [
    "what color is the shape?", "a red circle and a blue square", "describe the image", "the astronaut smiles",
    "a cup of coffee on a saucer", "the cat sleeps", "how many frames show the rocket?", "one two three four",
]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
           "<|video_pad|>"]
MIN_PIXELS, MAX_PIXELS = 56 * 56, 28 * 28 * 60  # small bounds, so that real photos meet both
GREEDY_TOKENS = 32
# (photo, top, left, height, width, scale): crops and scales of the photos, several aspect ratios
PHOTO_CUTS = [("astronaut", 0, 0, 512, 512, 0.25), ("coffee", 0, 0, 400, 600, 0.35), ("chelsea", 0, 0, 300, 451, 0.6),
              ("rocket", 0, 0, 427, 640, 0.1), ("coffee", 100, 0, 60, 600, 0.5), ("astronaut", 0, 0, 512, 512, 0.05)]


def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=384, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TRAINING_TEXT, trainer)
    return tok


def photos():
    """The cut photos, uint8 (H, W, 3) each."""
    from PIL import Image
    from skimage import data

    out = []
    for name, top, left, height, width, scale in PHOTO_CUTS:
        photo = getattr(data, name)()[top:top + height, left:left + width, :3]
        size = (max(1, round(photo.shape[1] * scale)), max(1, round(photo.shape[0] * scale)))
        out.append(np.asarray(Image.fromarray(photo).resize(size, Image.BICUBIC)))
    return out


def processor():
    from transformers import Qwen2VLImageProcessor

    return Qwen2VLImageProcessor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)


def model(family: str, tok):
    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLConfig,
                              Qwen2VLForConditionalGeneration)

    ids = {name: tok.token_to_id(name) for name in SPECIAL}
    common = dict(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e6,
                  rope_scaling={"type": "mrope", "mrope_section": [2, 1, 1]}, max_position_embeddings=1024,
                  image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                  vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                  bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
                  tie_word_embeddings=False)
    if family == "qwen2_5_vl":
        vision = dict(depth=2, hidden_size=32, intermediate_size=32, num_heads=4, out_hidden_size=32, patch_size=14,
                      temporal_patch_size=2, spatial_merge_size=2, window_size=112, fullatt_block_indexes=[1],
                      tokens_per_second=2, hidden_act="silu")
        return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**common, vision_config=vision))
    vision = dict(depth=2, embed_dim=32, num_heads=4, mlp_ratio=2, hidden_size=32, patch_size=14,
                  temporal_patch_size=2, spatial_merge_size=2, hidden_act="quick_gelu")
    return Qwen2VLForConditionalGeneration(Qwen2VLConfig(**common, vision_config=vision))


def patchified(frames: np.ndarray, patch: int = 14, temporal: int = 2, merge: int = 2):
    """Video frames (T, H, W, 3) uint8, H and W multiples of 28, as the image processor lays out pixels:
    rescaled, normalised with CLIP's mean and std, (grid_t * grid_h * grid_w, 3 * 2 * 14 * 14); and the grid."""
    from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    x = (frames.astype(np.float32) / 255.0 - np.array(OPENAI_CLIP_MEAN, np.float32)) / np.array(OPENAI_CLIP_STD,
                                                                                                   np.float32)
    x = x.transpose(0, 3, 1, 2)  # (T, C, H, W)
    t, c, h, w = x.shape
    gt, gh, gw = t // temporal, h // patch, w // patch
    x = x.reshape(gt, temporal, c, gh // merge, merge, patch, gw // merge, merge, patch)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(gt * gh * gw, c * temporal * patch * patch)
    return x, np.array([[gt, gh, gw]], np.int64)


def prompt_ids(tok, text: str, images=(), video=None, merge: int = 2):
    """<|im_start|>user\\n[vision]...text<|im_end|>\\n<|im_start|>assistant\\n, each image or video one
    <|vision_start|> <|image_pad|> x its merged tokens <|vision_end|>."""
    ids = [tok.token_to_id("<|im_start|>")] + tok.encode("user\n").ids
    for grid in images:
        ids += [tok.token_to_id("<|vision_start|>")] + [tok.token_to_id("<|image_pad|>")] * int(
            np.prod(grid) // merge ** 2) + [tok.token_to_id("<|vision_end|>")]
    if video is not None:
        ids += [tok.token_to_id("<|vision_start|>")] + [tok.token_to_id("<|video_pad|>")] * int(
            np.prod(video) // merge ** 2) + [tok.token_to_id("<|vision_end|>")]
    ids += tok.encode(text).ids + [tok.token_to_id("<|im_end|>")] + tok.encode("\n").ids
    return ids + [tok.token_to_id("<|im_start|>")] + tok.encode("assistant\n").ids


def generate(out: Path) -> None:
    import torch

    torch.manual_seed(0)
    tok = tokenizer()
    arrays = {}
    cut = photos()
    image_processor = processor()
    processed = []
    for index, photo in enumerate(cut):
        result = image_processor(images=[photo], return_tensors="np")
        arrays[f"photo_{index}"] = photo
        arrays[f"processed_{index}_pixels"] = result["pixel_values"].astype(np.float32)
        arrays[f"processed_{index}_grid"] = result["image_grid_thw"].astype(np.int64)
        processed.append((result["pixel_values"], result["image_grid_thw"]))
    # cases: photo 0 (astronaut 128x128: grid 1x10x10, merged 5x5, windows of 4: partial), photo 2 beside photo 3
    frames = np.stack([np.asarray(cut[2][:112, :168])] * 2 + [np.asarray(cut[2][20:132, 10:178])] * 2)
    video_pixels, video_grid = patchified(frames)
    arrays["video_frames"], arrays["video_pixels"], arrays["video_grid"] = frames, video_pixels, video_grid
    cases = {"one_image": ([0], False), "two_images": ([2, 1], False), "video": ([], True), "text": ([], False)}
    for family in FAMILIES:
        net = model(family, tok).eval()
        with torch.no_grad():  # random weights, larger than the init so that the logits are not all alike
            for name, param in net.named_parameters():
                param.copy_(torch.randn_like(param) * 0.1 + 1.0) if "norm" in name or "ln_q" in name \
                    else param.normal_(0.0, 0.08)
        folder = HERE / f"tiny_{family}"
        net.save_pretrained(folder, safe_serialization=True)
        image_processor.save_pretrained(folder)
        tok.save(str(folder / "tokenizer.json"))
        for case, (images, video) in cases.items():
            grids = [processed[i][1][0] for i in images]
            ids = prompt_ids(tok, "what is in it?", grids, video_grid[0] if video else None)
            inputs = {"input_ids": torch.tensor([ids])}
            if images:
                inputs["pixel_values"] = torch.tensor(np.concatenate([processed[i][0] for i in images]))
                inputs["image_grid_thw"] = torch.tensor(np.stack(grids))
            if video:
                inputs["pixel_values_videos"] = torch.tensor(video_pixels)
                inputs["video_grid_thw"] = torch.tensor(video_grid)
                if family == "qwen2_5_vl":
                    inputs["second_per_grid_ts"] = torch.tensor([1.0])  # temporal patch 2 / 2 fps
            with torch.no_grad():
                logits = net(**inputs).logits[0].numpy().astype(np.float32)
                greedy = net.generate(**inputs, max_new_tokens=GREEDY_TOKENS, min_new_tokens=GREEDY_TOKENS,
                                      do_sample=False)
                if images or video:
                    pixels = inputs["pixel_values"] if images else inputs["pixel_values_videos"]
                    grid = inputs["image_grid_thw"] if images else inputs["video_grid_thw"]
                    vision = net.model.visual(pixels, grid_thw=grid)
                    vision = getattr(vision, "pooler_output", vision)
                    arrays[f"{family}_vision_{case}"] = vision.numpy().astype(np.float32)
            arrays[f"{family}_ids_{case}"] = np.asarray(ids, np.int32)
            arrays[f"{family}_logits_{case}"] = logits
            arrays[f"{family}_greedy_{case}"] = greedy[0, len(ids):].numpy().astype(np.int32)
    np.savez_compressed(out, **arrays)


def check_written_back(folder: Path, expected_last=None) -> float:
    """Loads a folder `mindvl export hf` wrote with transformers and returns the largest logit difference over the
    two-image case: from the stored references (a converted checkpoint written back), or from `expected_last`, the
    last position's logits mindvl computed (a fine-tuned run written back). The issue's round trip, run by hand: it
    needs PyTorch."""
    import json

    import torch
    from transformers import AutoModelForImageTextToText

    family = json.loads((folder / "config.json").read_text())["model_type"]
    stored = np.load(HERE / "qwen2_vl.npz")
    net = AutoModelForImageTextToText.from_pretrained(folder).eval()
    pixels = np.concatenate([stored["processed_2_pixels"], stored["processed_1_pixels"]])
    grids = np.concatenate([stored["processed_2_grid"], stored["processed_1_grid"]])
    with torch.no_grad():
        logits = net(input_ids=torch.tensor(stored[f"{family}_ids_two_images"][None].astype(np.int64)),
                     pixel_values=torch.tensor(pixels), image_grid_thw=torch.tensor(grids)).logits[0].numpy()
    if expected_last is not None:
        return float(np.abs(logits[-1] - expected_last).max())
    return float(np.abs(logits - stored[f"{family}_logits_two_images"]).max())


if __name__ == "__main__":  # python tests/references/ref_qwen2_vl.py --written-back DIR [--expected-last FILE.npy]
    import sys

    if sys.argv[1:2] != ["--written-back"] or len(sys.argv) < 3:
        raise SystemExit("usage: ref_qwen2_vl.py --written-back DIR [--expected-last FILE.npy] (references: "
                         "make_references.py qwen2_vl)")
    expected = np.load(sys.argv[4]) if sys.argv[3:4] == ["--expected-last"] else None
    print(f"{sys.argv[2]}: transformers' logits differ from mindvl's by at most "
          f"{check_written_back(Path(sys.argv[2]), expected):.2e}")
