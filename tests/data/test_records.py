"""MindRecord tables: shard layout, table_files, readers, and byte-identical writes."""
import numpy as np
import hashlib
import json
from pathlib import Path

import easy_vqa

from mindvl.data import records


def _rows(start, stop):
    png = Path(easy_vqa.get_train_image_paths()[0]).read_bytes()
    return [{"sample_id": i, "image": png, "image_id": i % 7, "question_id": i % 5, "caption_id": i % 3,
             "answer_id": i % 13} for i in range(start, stop)]


def _sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_shard_ranges_are_contiguous_and_balanced():
    ranges = records.shard_ranges(10, 4)
    assert [list(r) for r in ranges] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert [len(r) for r in records.shard_ranges(2, 3)] == [1, 1, 0]
    assert records.shard_names("train", 1) == ["train.mindrecord"]
    assert records.shard_names("test", 3) == ["test-00000-of-00003.mindrecord", "test-00001-of-00003.mindrecord",
                                             "test-00002-of-00003.mindrecord"]


def test_separately_written_shards_read_as_one_split_in_sample_id_order(tmp_path):
    import mindspore.dataset as ds

    names = records.shard_names("train", 3)
    for name, span in zip(names, records.shard_ranges(11, 3)):
        assert records.write_table(tmp_path / name, records.EXAMPLE_SCHEMA, _rows(span.start, span.stop), name) \
            == len(span)
    (tmp_path / "meta.json").write_text(json.dumps({"tables": {"train": names, "test": ["test.mindrecord"]}}))
    files = records.table_files(tmp_path, "train")
    assert files == [str(tmp_path / name) for name in names]
    assert records.table_files(tmp_path, "speech") == [str(tmp_path / "speech.mindrecord")]
    assert [r["sample_id"] for r in records.read_split(tmp_path, "train", ["sample_id"])] == list(range(11))
    data = ds.MindDataset(files, columns_list=["sample_id", "image_id"], shuffle=False)
    assert [int(r["sample_id"]) for r in data.create_dict_iterator(output_numpy=True)] == list(range(11))


def test_table_files_of_a_root_without_meta_is_the_single_file(tmp_path):
    assert records.table_files(tmp_path, "test") == [str(tmp_path / "test.mindrecord")]


def test_the_same_rows_give_byte_identical_files_in_any_folder(tmp_path):
    for folder in ("a", "b/c"):
        (tmp_path / folder).mkdir(parents=True)
        records.write_table(tmp_path / folder / "train.mindrecord", records.EXAMPLE_SCHEMA, _rows(0, 20), "x")
    for name in ("train.mindrecord", "train.mindrecord.db"):
        assert _sha(tmp_path / "a" / name) == _sha(tmp_path / "b" / "c" / name)
    # what the file records about its location: its base name only (so shards are written under final names)
    header = (tmp_path / "a" / "train.mindrecord").read_bytes()[:4096]
    assert b'"shard_addresses":["train.mindrecord"]' in header and str(tmp_path).encode() not in header


def test_an_empty_table_is_valid(tmp_path):
    assert records.write_table(tmp_path / "test.mindrecord", records.EXAMPLE_SCHEMA, [], "empty") == 0
    assert records.read_table(tmp_path / "test.mindrecord") == []


def test_several_images_share_one_bytes_field_and_one_image_stays_itself():
    from mindvl.data.records import images_of, pack_images

    assert pack_images([b"\x89PNG one"]) == b"\x89PNG one" and pack_images([]) == b""
    assert images_of(b"\x89PNG one") == [b"\x89PNG one"] and images_of(b"") == []
    several = [b"\x89PNG one", b"", b"\xff\xd8 jpeg" * 100]
    assert images_of(pack_images(several)) == several
    assert images_of(np.frombuffer(pack_images(several), np.uint8)) == several  # as MindDataset hands it
