"""Frozen pretrained features of a real (small) data root, through the feature cache."""
import numpy as np
import pytest
from mindspore import Tensor

from mindvl import preprocess as P
from mindvl.config import PreprocessConfig
from mindvl.data.records import read_split
from mindvl import from_pretrained
from mindvl.pretrained.features import FrozenEncoders


@pytest.fixture(scope="module")
def encoders(converted, tmp_path_factory):
    return FrozenEncoders(tmp_path_factory.mktemp("cache"), converted("dinov2"), converted("minilm"),
                          converted("whisper-base"), image_size=112, batch_size=8)


@pytest.fixture(scope="module")
def images(small_cfg, small_report):
    return list({int(r["image_id"]): r["image"] for r in read_split(small_cfg.data.root, "train",
                                                                  ["image_id", "image"])}.values())


def test_image_features_are_dinov2_cls_and_mean_patch_tokens_and_are_cached(encoders, converted, images):
    features = encoders.images(images)
    assert features.shape == (len(images), 768) and encoders.stats["image"].computed == len(images)
    config_input = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
    pixels = P.decode_image(images[0], PreprocessConfig(image_size=112, **config_input))
    tokens, cls = from_pretrained(converted("dinov2"), image_size=112)(Tensor(pixels[None]))
    np.testing.assert_allclose(features[0, :384], cls.asnumpy()[0], atol=2e-2, rtol=2e-3)  # float16 cache
    np.testing.assert_allclose(features[0, 384:], tokens.asnumpy()[0, 1:].mean(0), atol=2e-2, rtol=2e-3)
    again = encoders.images(images)
    assert encoders.stats["image"].computed == 0 and encoders.stats["image"].hits == len(images)
    np.testing.assert_array_equal(features, again)


def test_text_and_speech_features(encoders, small_cfg, small_report):
    texts = encoders.texts(["what color is the shape?", "is there a circle?"])
    assert texts.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(texts, axis=1), 1.0, atol=2e-3)
    clips = [r["pcm"] for r in read_split(small_cfg.data.root, "speech", ["pcm"])][:5]
    speech = encoders.speech(clips, small_cfg.preprocess.sample_rate)
    assert speech.shape == (5, 512) and np.all(np.isfinite(speech))
    assert np.abs(speech[0] - speech[1]).max() > 1e-3  # different clips, different features
