"""Reading a built data set online: mindspore.dataset over this rank's shards (loader.py), per-modality
stages in parallel workers (stages.py, augment.py), packing into static buckets (packing.py,
conversation_packing.py), order and randomness as functions of the seed (order.py), the splits (splits.py),
resumable training streams (stream.py), the generative model's conversations (conversation_loader.py), test
examples as a client sends them (examples.py) and the lengths the packer sees (lengths.py)."""
